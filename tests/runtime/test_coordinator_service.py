"""The coordinator service over real loopback sockets, with a real controller (CLI subprocess):
the friendly path, and strangers, duplicates, garbage and departures."""

from __future__ import annotations

import socket
import struct

import pytest

from bench.channel_simulation import simulate_fanout_and_vote
from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.step import messages as msg
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.controller_client import ControllerClient
from fthsdp.step.coordinator import CoordinatorService
from protos import job_secret
from protos import replica_pb2 as rpb
from tests.trainer_secret import SECRET

WAIT_S = 20.0


@pytest.fixture
def service(controller_process):
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "svc", "--join-timeout-s", "0.2")
    settings = RuntimeSettings(job_id="svc", replica_id="r0", world_size=2, controller_address=ctl.grpc,
                               coordinator_address="127.0.0.1:0", quorum_timeout_s=WAIT_S, gather_timeout_s=5.0,
                               allreduce_timeout_s=5.0, job_secret=SECRET)
    svc = CoordinatorService(settings, ControllerClient(ctl.grpc, "svc", "r0", "inc"), "127.0.0.1", 0).start()
    yield svc
    svc.close(linger_s=0.5)


KEY = SECRET.key(job_secret.PURPOSE_COORDINATOR)


def rank(svc: CoordinatorService, r: int) -> CoordinatorClient:
    return CoordinatorClient(svc.address, r).connect(5.0, msg.hello(r, 2, "svc", "r0", f"127.0.0.1:{1000 + r}",
                                                                   f"127.0.0.1:{2000 + r}", "i"), KEY)


def expect(client: CoordinatorClient, kind: str):
    got = client.receive(WAIT_S)
    assert got is not None and got[0] == kind, got
    return got[1]


def round_trip(ranks: list[CoordinatorClient], step: int, votes: list[bool]) -> list:
    for c in ranks:
        c.send(msg.begin(step))
    plans = [expect(c, "plan") for c in ranks]
    for c, ok, p in zip(ranks, votes, plans):
        c.send(msg.vote(p.attempt, ok, "" if ok else "injected", 1.0, 4))
    return [expect(c, "decision") for c in ranks]


def test_every_rank_gets_the_same_plan_and_the_same_decision(service):
    ranks = [rank(service, 0), rank(service, 1)]
    decisions = round_trip(ranks, 0, [True, True])
    assert {d.outcome for d in decisions} == {rpb.StepDecision.COMMIT} and decisions[0] == decisions[1]
    decisions = round_trip(ranks, 1, [True, False])
    assert {d.outcome for d in decisions} == {rpb.StepDecision.RETRY} and "rank 1 voted no: injected" in decisions[0].reason


def test_a_duplicate_rank_is_refused_and_the_replica_goes_on(service):
    ranks = [rank(service, 0), rank(service, 1)]
    with pytest.raises(ChannelError, match="refused rank 1.*rank 1 is already connected"):
        rank(service, 1)  # a second process with the secret claims rank 1
    assert {d.outcome for d in round_trip(ranks, 0, [True, True])} == {rpb.StepDecision.COMMIT}


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x05\xff\xff\xff\xff\x0f",   # not a frame
                                     struct.pack(">I", 1 << 30),                # a 1 GiB frame announced
                                     msg.frame(msg.vote(1, True, "", 0.0, 0))])  # a vote without a hello
def test_a_stranger_sending_garbage_is_cut_off_without_disturbing_the_ranks(service, garbage):
    ranks = [rank(service, 0)]
    host, _, port = service.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as stranger:
        stranger.sendall(garbage)
        reply = b""
        while chunk := stranger.recv(4096):  # the challenge; then the coordinator says why, and closes
            reply += chunk
        bodies = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES).feed(reply)
        assert [msg.decode_coordinator_frame(b)[0] for b in bodies] == ["challenge", "refusal"]
        assert msg.decode_coordinator_frame(bodies[1])[1].reason
    ranks.append(rank(service, 1))
    assert {d.outcome for d in round_trip(ranks, 0, [True, True])} == {rpb.StepDecision.COMMIT}


def test_a_rank_that_leaves_fails_the_replica_for_the_others(service):
    ranks = [rank(service, 0), rank(service, 1)]
    round_trip(ranks, 0, [True, True])
    ranks[1].close()
    ranks[0].send(msg.begin(1))
    refusal = expect(ranks[0], "no_plan")
    assert refusal.kind == rpb.NoPlan.FATAL and "rank 1 left the replica" in refusal.reason


def test_closing_ranks_get_the_last_word_after_the_report(service):
    ranks = [rank(service, 0), rank(service, 1)]
    round_trip(ranks, 0, [True, True])
    for c in ranks:
        c.send(msg.close(1, "loop ended"))
    finished = [expect(c, "finished") for c in ranks]
    assert all(f.step == 0 for f in finished)  # the last committed step


def test_a_rank_gives_a_clear_error_when_no_coordinator_listens():
    with pytest.raises(ChannelError, match="could not reach its coordinator"):
        CoordinatorClient("127.0.0.1:1", 1).connect(0.2, msg.hello(1, 2, "j", "r", "a:1", "b:2", ""), KEY)


def test_a_simulated_round_with_many_ranks_commits():
    timings = simulate_fanout_and_vote(256, timeout_s=30.0)
    assert timings.outcome == "commit"
    assert 0 <= timings.fanout_s <= timings.decision_s
