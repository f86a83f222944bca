"""The relay frames: bounded, typed, checked before they touch state; each side takes only its own kinds."""

from __future__ import annotations

import pytest

from fthsdp.step import messages as msg
from fthsdp.step import relay_messages as rm
from protos import job_secret
from protos import replica_pb2 as rpb
from tests.trainer_secret import SECRET

KEY = SECRET.key(job_secret.PURPOSE_COORDINATOR)


def body(frame) -> bytes:
    return frame.SerializeToString()


def test_relay_frames_round_trip():
    kind, vote = rm.decode_relay_frame(body(rm.group_vote(3, True, range(91, 182), "", 90.5, 7)))
    assert kind == "group_vote" and list(vote.ranks) == list(range(91, 182)) and vote.loss_sum == 90.5
    kind, digests = rm.decode_relay_frame(body(rm.group_digests(3, 4, [(5, b"a" * 32), (6, b"b" * 32)])))
    assert kind == "group_digests" and list(digests.ranks) == [5, 6] and digests.sha256[1] == b"b" * 32
    kind, relayed = rm.decode_relay_frame(body(rm.relayed(4, msg.close(2, "bye"))))
    assert kind == "relayed" and relayed.frame.close.reason == "bye"


@pytest.mark.parametrize("frame, message", [
    (msg.vote(1, True, "", 0.0, 0), r"a relay sends only .*, got a vote"),
    (rm.relay_hello(1, 3, 9, "j", "r", "h:1", ""), "got a relay_hello"),
    (rm.group_vote(1, True, []), "group vote names no rank"),
    (rm.group_vote(1, True, [3, 3]), "names a rank twice"),
    (rm.group_vote(1, True, [-1]), "names rank -1"),
    (rm.group_vote(1, True, range(rm.MAX_GROUP_RANKS + 1)), "names 1025 ranks; a group has at most 1024"),
    (rm.group_vote(1, False, [3, 4], "no"), "a group's no names the one rank"),
    (rm.group_vote(0, True, [3]), "attempt must be between 1"),
    (rpb.RankFrame(group_vote=rpb.GroupVote(attempt=1, ok=True, ranks=[3], tokens=-1)), "tokens must be >= 0"),
    (rm.group_begin(-2, [3]), "group begin step must be a step"),
    (rpb.RankFrame(group_digests=rpb.GroupDigests(attempt=1, step=1, ranks=[3, 4], sha256=[b"x" * 32])),
     "name 2 ranks and carry 1 digests"),
    (rm.group_digests(1, 1, [(3, b"short")]), "a digest is 32 bytes, got 5"),
    (rm.relayed(3, msg.begin(2)), r"forwards a rank's \['close', 'hello'\] one by one, got a begin"),
    (rm.relayed(3, rm.relayed(3, msg.close(1, ""))), "got a relayed"),
    (rm.relayed(3, msg.hello(4, 9, "j", "r", "a:1", "b:2", "")), "a relayed hello of rank 4 sent for rank 3"),
    (rm.relayed(3, msg.hello(3, 9, "", "r", "a:1", "b:2", "")), "job_id must not be empty"),
    (rm.rank_left(-4, "x"), "rank_left of rank -4"),
])
def test_bad_relay_frames_are_named(frame, message):
    with pytest.raises(msg.MessageError, match=message):
        rm.decode_relay_frame(body(frame))


@pytest.mark.parametrize("frame", [rm.group_vote(1, True, [1]), rm.relayed(1, msg.close(1, "")),
                                   rm.rank_left(1, ""), rm.relay_hello(1, 3, 9, "j", "r", "h:1", "")])
def test_a_rank_connection_cannot_send_what_only_a_relay_sends(frame):
    with pytest.raises(msg.MessageError, match="comes from a relay only"):
        msg.decode_rank_frame(body(frame))


@pytest.mark.parametrize("frame, message", [
    (rm.relay_hello(0, 3, 9, "j", "r", "h:1", ""), "relay_hello for group 0"),
    (rm.relay_hello(1, 1025, 9, "j", "r", "h:1", ""), "fanout must be 1..1024"),
    (rm.relay_hello(1, 3, 9, "j", "r", "", ""), "relay address must not be empty"),
    (rm.group_vote(1, True, [3]), "a group_vote frame before this connection.s hello"),
])
def test_bad_first_frames_are_named(frame, message):
    with pytest.raises(msg.MessageError, match=message):
        rm.decode_first_frame(body(frame))


def test_a_to_ranks_is_for_a_relay_only_and_cannot_nest():
    plan = rpb.CoordinatorFrame(no_plan=rpb.NoPlan(attempt=1, step=1, kind=rpb.NoPlan.RETRY))
    outer = rm.to_ranks([(4, plan)])
    with pytest.raises(msg.MessageError, match="for a relay, not for a rank"):
        msg.decode_coordinator_frame(body(outer))
    kind, parts = rm.decode_down_frame(body(outer))
    assert kind == "to_ranks" and parts == [(4, "no_plan", plan.SerializeToString())]
    with pytest.raises(msg.MessageError, match="for a relay, not for a rank"):
        rm.decode_down_frame(body(rm.to_ranks([(4, outer)])))


def test_relay_hellos_and_welcomes_are_tagged_under_their_own_label():
    challenge = b"c" * 32
    signed = rm.sign_relay_hello(KEY, rm.relay_hello(1, 3, 9, "j", "r", "h:1", "i"), challenge)
    h = signed.relay_hello
    assert rm.relay_hello_is_authentic(KEY, h, challenge) and not rm.relay_hello_is_authentic(KEY, h, b"d" * 32)
    moved = rpb.RelayHello()
    moved.CopyFrom(h)
    moved.group = 2  # a relay cannot claim another group with a recorded tag
    assert not rm.relay_hello_is_authentic(KEY, moved, challenge)
    w = rm.relay_welcome(KEY, h, challenge).welcome
    assert rm.relay_welcome_is_authentic(KEY, w, h, challenge)
    rank_hello = msg.sign_hello(KEY, msg.hello(1, 9, "j", "r", "a:1", "b:2", ""), challenge)
    assert not rm.relay_welcome_is_authentic(KEY, msg.welcome(KEY, rank_hello.hello, challenge).welcome, h, challenge)


def test_a_redirecting_welcome_is_tagged_over_the_relay_address():
    challenge = b"c" * 32
    h = msg.sign_hello(KEY, msg.hello(4, 9, "j", "r", "a:1", "b:2", ""), challenge).hello
    w = msg.welcome(KEY, h, challenge, "10.0.0.3:4000").welcome
    assert msg.welcome_is_authentic(KEY, w, h, challenge)
    w.relay_address = "6.6.6.6:4000"  # a stranger on the path cannot send the rank elsewhere
    assert not msg.welcome_is_authentic(KEY, w, h, challenge)
