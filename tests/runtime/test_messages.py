"""The intra-replica frames: bounded, typed, every field checked before it touches state."""

from __future__ import annotations

import pytest

from fthsdp.step import messages as msg
from protos import replica_pb2 as rpb


def body(frame) -> bytes:
    return frame.SerializeToString()


def test_rank_frames_round_trip():
    kind, hello = msg.decode_rank_frame(body(msg.hello(3, 8, "j", "r1", "10.0.0.1:5", "10.0.0.1:6", "inc")))
    assert kind == "hello" and (hello.rank, hello.world_size, hello.ftar_address) == (3, 8, "10.0.0.1:5")
    kind, vote = msg.decode_rank_frame(body(msg.vote(4, False, "x" * 5000, 1.5, 7)))
    assert kind == "vote" and vote.ok is False and len(vote.reason) == msg.MAX_REASON_CHARS  # clipped on send


@pytest.mark.parametrize("frame, message", [
    (rpb.RankFrame(), "carries no message"),
    (msg.hello(-1, 2, "j", "r", "a:1", "b:2", ""), "hello from rank -1"),
    (msg.hello(0, 2, "", "r", "a:1", "b:2", ""), "job_id must not be empty"),
    (msg.hello(0, 2, "j", "r" * 200, "a:1", "b:2", ""), "replica_id is 200 characters long; the limit is 128"),
    (msg.hello(0, 2, "j", "r", "", "b:2", ""), "ftar_address must not be empty"),
    (rpb.RankFrame(hello=rpb.RankHello(rank=0, world_size=2, job_id="j", replica_id="r", ftar_address="a",
                                       state_address="b", auth=b"x" * 65)), "auth is 65 bytes"),
    (msg.begin(-3), "begin step must be a step between 0"),
    (rpb.RankFrame(vote=rpb.StepVote(attempt=0, ok=True)), "attempt must be between 1"),
    (rpb.RankFrame(vote=rpb.StepVote(attempt=1, ok=True, tokens=-5)), "vote tokens must be >= 0, got -5"),
    (msg.digest(1, 2, b"short"), "a digest is 32 bytes, got 5"),
    (rpb.RankFrame(vote=rpb.StepVote(attempt=1, reason="y" * 1001)), "vote reason is 1001 characters"),
])
def test_bad_rank_frames_are_named(frame, message):
    with pytest.raises(msg.MessageError, match=message):
        msg.decode_rank_frame(body(frame))


def test_garbage_and_oversized_frames_are_refused():
    with pytest.raises(msg.MessageError, match="is not a RankFrame"):
        msg.decode_rank_frame(b"\xff\xff\xff\xff\x0f")
    with pytest.raises(msg.MessageError, match="larger than the limit"):
        msg.decode_rank_frame(b"\x00" * (msg.MAX_RANK_FRAME_BYTES + 1))
    reader = msg.FrameReader(1024)
    with pytest.raises(msg.MessageError, match="announces 1025 bytes; the limit is 1024"):
        reader.feed(msg.FRAME.pack(1025))  # refused from the header, before buffering the body


def test_a_vote_whose_ok_is_not_a_boolean_is_not_a_yes():
    """Field 2 sent as a string "true" instead of a varint: it is an unknown field, ok stays False."""
    raw = rpb.StepVote(attempt=1).SerializeToString() + b"\x12\x04true"
    frame = b"\x1a" + bytes([len(raw)]) + raw  # RankFrame.vote = field 3
    kind, vote = msg.decode_rank_frame(frame)
    assert kind == "vote" and vote.ok is False


def test_frames_split_anywhere_are_reassembled():
    data = b"".join(msg.frame(msg.begin(s)) for s in range(50))
    reader, bodies = msg.FrameReader(1024), []
    for i in range(0, len(data), 3):
        bodies += reader.feed(data[i:i + 3])
    assert [msg.decode_rank_frame(b)[1].step for b in bodies] == list(range(50))


@pytest.mark.parametrize("frame, message", [
    (rpb.CoordinatorFrame(plan=rpb.StepPlan(attempt=1, step=0)), "carries no quorum"),
    (rpb.CoordinatorFrame(no_plan=rpb.NoPlan(attempt=1)), "no_plan kind 0 is not RETRY"),
    (rpb.CoordinatorFrame(decision=rpb.StepDecision(attempt=1)), "decision outcome 0 is not COMMIT or RETRY"),
    (rpb.CoordinatorFrame(decision=rpb.StepDecision(attempt=0, outcome=rpb.StepDecision.COMMIT)), "attempt"),
])
def test_bad_coordinator_frames_are_named(frame, message):
    with pytest.raises(msg.MessageError, match=message):
        msg.decode_coordinator_frame(body(frame))
