"""Relays on real processes and loopback sockets: a replica of 9 ranks in groups of 3 (ranks
0..2 talk to the coordinator; relay processes for ranks 3 and 6 serve 3..5 and 6..8), against a
real controller (CLI subprocess). Steps commit through the relays; a relay SIGKILLed mid-vote
makes the attempt RETRY with its group named absent, and its ranks lose their coordinator;
strangers at a relay's port, and forged or misbehaving relays at the coordinator's, get nowhere."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.step import messages as msg
from fthsdp.step import relay_messages as rm
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.controller_client import ControllerClient
from fthsdp.step.coordinator import CoordinatorService
from protos import job_secret
from protos import replica_pb2 as rpb
from tests import trainer_secret
from tests.runtime.cluster import _read_line
from tests.trainer_secret import SECRET

WAIT_S = 20.0
WORLD, FANOUT = 9, 3
KEY = SECRET.key(job_secret.PURPOSE_COORDINATOR)


def coordinator(controller_process) -> CoordinatorService:
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "relays", "--join-timeout-s", "0.2")
    settings = RuntimeSettings(job_id="relays", replica_id="r0", world_size=WORLD, relay_fanout=FANOUT,
                               controller_address=ctl.grpc, coordinator_address="127.0.0.1:0",
                               quorum_timeout_s=WAIT_S, gather_timeout_s=5.0, allreduce_timeout_s=5.0, digest_every_steps=1,
                               job_secret=SECRET)
    return CoordinatorService(settings, ControllerClient(ctl.grpc, "relays", "r0", "inc"), "127.0.0.1", 0).start()


def start_relays(svc: CoordinatorService, procs: dict) -> dict[int, str]:
    """Start a relay process for every relay rank (into `procs`); their addresses once they reached `svc`."""
    for rank in svc.settings.relay_tree().relays:
        cfg = {"rank": rank, "world_size": WORLD, "relay_fanout": FANOUT, "coordinator": svc.address,
               "gather_timeout_s": svc.settings.gather_timeout_s}
        procs[rank] = subprocess.Popen([sys.executable, "-m", "tests.runtime.relay_worker", json.dumps(cfg)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env={**os.environ, **trainer_secret.ENV})
    return {rank: _read_line(proc, WAIT_S).strip() for rank, proc in procs.items()}


def stop(svc: CoordinatorService, procs: dict) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(10.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
    svc.close(linger_s=0.5)


@pytest.fixture
def replica(controller_process):
    """(coordinator service, {relay rank: its process}, {relay rank: its address})."""
    svc, procs = coordinator(controller_process), {}
    try:
        yield svc, procs, start_relays(svc, procs)
    finally:
        stop(svc, procs)


def connect(svc: CoordinatorService, r: int) -> CoordinatorClient:
    return CoordinatorClient(svc.address, r).connect(WAIT_S, msg.hello(r, WORLD, "relays", "r0", f"127.0.0.1:{1000 + r}",
                                                                       f"127.0.0.1:{2000 + r}", "i"), KEY)


def expect(client: CoordinatorClient, kind: str):
    got = client.receive(WAIT_S)
    assert got is not None and got[0] == kind, got
    return got[1]


def train_step(ranks: list[CoordinatorClient], step: int) -> list:
    for c in ranks:
        c.send(msg.begin(step))
    plans = [expect(c, "plan") for c in ranks]
    for c, p in zip(ranks, plans):
        c.send(msg.vote(p.attempt, True, "", 0.5, 8))
    decisions = [expect(c, "decision") for c in ranks]
    if decisions[0].outcome == rpb.StepDecision.COMMIT:
        for c, p in zip(ranks, plans):
            c.send(msg.digest(p.attempt, step, bytes([step]) * 32))
    return decisions


def test_steps_commit_through_relays_and_a_killed_relay_retries_the_attempt_with_its_group_absent(replica):
    svc, procs, addresses = replica
    ranks = [connect(svc, r) for r in range(WORLD)]
    assert [c.relay_address for c in ranks] == [""] * 3 + [addresses[3]] * 3 + [addresses[6]] * 3
    assert len(svc._core.links()) == 5  # 3 ranks and 2 relays: a broadcast is 5 writes, not 9
    for step in (0, 1):
        decisions = train_step(ranks, step)
        assert {d.outcome for d in decisions} == {rpb.StepDecision.COMMIT} and len({d.attempt for d in decisions}) == 1
        assert "all 9 ranks voted yes" in decisions[0].reason

    for c in ranks:
        c.send(msg.begin(2))
    plans = [expect(c, "plan") for c in ranks]
    for c, p in zip(ranks[:6], plans):  # ranks 0..5 voted; then group 2's relay dies before its group's vote
        c.send(msg.vote(p.attempt, True, "", 0.5, 8))
    procs[6].send_signal(signal.SIGKILL)
    procs[6].wait(WAIT_S)
    decisions = [expect(c, "decision") for c in ranks[:6]]
    assert {(d.attempt, d.outcome) for d in decisions} == {(plans[0].attempt, rpb.StepDecision.RETRY)}
    assert "ranks 6..8 left the replica: their relay (rank 6) is gone" in decisions[0].reason
    for c in ranks[6:]:  # the dead relay's ranks lost their coordinator
        with pytest.raises(ChannelError):
            while True:
                assert c.receive(WAIT_S) is not None, "a rank behind the dead relay kept its connection"
    ranks[0].send(msg.begin(2))
    fatal = expect(ranks[0], "no_plan")
    assert fatal.kind == rpb.NoPlan.FATAL and "ranks 6..8 left the replica" in fatal.reason
    for c in ranks:
        c.close()


def test_one_silent_rank_leaves_only_itself_out_not_its_relay_group(replica):
    """Race 8 of issue 28: rank 7 (behind relay 6) never votes; its group's other ranks did.
    The relay sends up what they said before the coordinator's timeout: only rank 7 is named."""
    svc, procs, addresses = replica
    ranks = [connect(svc, r) for r in range(WORLD)]
    assert {d.outcome for d in train_step(ranks, 0)} == {rpb.StepDecision.COMMIT}
    for c in ranks:
        c.send(msg.begin(1))
    plans = [expect(c, "plan") for c in ranks]
    for k, (c, p) in enumerate(zip(ranks, plans)):
        if k != 7:
            c.send(msg.vote(p.attempt, True, "", 0.5, 8))
    decisions = [expect(c, "decision") for c in ranks]
    assert {d.outcome for d in decisions} == {rpb.StepDecision.RETRY}
    assert "1 rank(s) did not vote" in decisions[0].reason and decisions[0].reason.endswith(": 7"), \
        decisions[0].reason
    for c in ranks:
        c.close()


def test_a_relay_admits_only_its_groups_ranks_holding_the_secret(replica):
    svc, procs, addresses = replica
    relay = addresses[3]
    stranger_key = job_secret.parse(job_secret.generate(), "a stranger").key(job_secret.PURPOSE_COORDINATOR)
    hello = msg.hello(4, WORLD, "relays", "r0", "127.0.0.1:1", "127.0.0.1:2", "i")
    with pytest.raises(ChannelError, match="hello not authenticated"):
        CoordinatorClient(relay, 4).connect(WAIT_S, hello, stranger_key)
    with pytest.raises(ChannelError, match=r"rank 7 is not in this relay's group \(ranks 3..5\)"):
        CoordinatorClient(relay, 7).connect(WAIT_S, msg.hello(7, WORLD, "relays", "r0", "a:1", "b:2", "i"), KEY)
    with pytest.raises(ChannelError, match="this relay serves job 'relays'"):
        CoordinatorClient(relay, 4).connect(WAIT_S, msg.hello(4, WORLD, "other", "r0", "a:1", "b:2", "i"), KEY)
    host, _, port = relay.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as garbage:
        garbage.sendall(msg.frame(msg.vote(1, True, "", 0.0, 0)))  # a vote without a hello
        reply = b""
        while chunk := garbage.recv(4096):
            reply += chunk
        bodies = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES).feed(reply)
        assert [msg.decode_coordinator_frame(b)[0] for b in bodies] == ["challenge", "refusal"]
    first = connect(svc, 4)
    assert first.relay_address == relay
    with pytest.raises(ChannelError, match="rank 4 is already connected"):
        connect(svc, 4)  # a second process with the secret claims rank 4 at the relay
    ranks = [connect(svc, r) for r in range(WORLD) if r != 4] + [first]
    assert {d.outcome for d in train_step(ranks, 0)} == {rpb.StepDecision.COMMIT}  # nobody else was disturbed
    for c in ranks:
        c.close()


def test_a_rank_that_arrives_before_its_relay_is_told_to_retry_then_reaches_it(controller_process):
    svc, procs = coordinator(controller_process), {}
    try:
        host, _, port = svc.address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as early:
            reader = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES)
            bodies: list[bytes] = []
            while not bodies:
                bodies += reader.feed(early.recv(4096))
            kind, challenge = msg.decode_coordinator_frame(bodies.pop(0))
            early.sendall(msg.frame(msg.sign_hello(KEY, msg.hello(4, WORLD, "relays", "r0", "a:1", "b:2", "i"),
                                                   challenge.nonce)))
            while not bodies:
                bodies += reader.feed(early.recv(4096))
            kind, refusal = msg.decode_coordinator_frame(bodies[0])
        assert kind == "refusal" and refusal.retry and "the relay of rank 4's group is not connected yet" in \
            refusal.reason
        addresses = start_relays(svc, procs)
        client = connect(svc, 4)
        assert client.relay_address == addresses[3]
        client.close()
    finally:
        stop(svc, procs)


class Raw:
    """A bare socket to the coordinator, frame by frame."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
        self.reader = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES)
        self.bodies: list[bytes] = []

    def next(self) -> tuple[str, object]:
        while not self.bodies:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the coordinator closed the connection without a word"
            self.bodies += self.reader.feed(chunk)
        return msg.decode_coordinator_frame(self.bodies.pop(0))

    def closed(self) -> bool:
        return self.sock.recv(1) == b""


def test_the_coordinator_admits_only_relays_holding_the_secret_and_only_for_their_own_group(controller_process):
    svc = coordinator(controller_process)
    stranger_key = job_secret.parse(job_secret.generate(), "a stranger").key(job_secret.PURPOSE_COORDINATOR)
    hello = rm.relay_hello(1, FANOUT, WORLD, "relays", "r0", "127.0.0.1:9", "i")
    try:
        forged = Raw(svc.address)
        _, challenge = forged.next()
        forged.sock.sendall(msg.frame(rm.sign_relay_hello(stranger_key, hello, challenge.nonce)))
        kind, refusal = forged.next()
        assert kind == "refusal" and "relay hello not authenticated" in refusal.reason and forged.closed()
        assert svc._core.link_group == {}

        relay = Raw(svc.address)
        _, challenge = relay.next()
        signed = rm.sign_relay_hello(KEY, hello, challenge.nonce)
        relay.sock.sendall(msg.frame(signed))
        kind, welcome = relay.next()
        assert kind == "welcome" and rm.relay_welcome_is_authentic(KEY, welcome, signed.relay_hello, challenge.nonce)
        relay.sock.sendall(msg.frame(rm.relayed(7, msg.hello(7, WORLD, "relays", "r0", "a:1", "b:2", "i"))))
        kind, refusal = relay.next()  # rank 7 is group 2's: the relay of group 1 is cut off, nothing bound
        assert kind == "refusal" and "naming rank(s) [7] outside its group" in refusal.reason and relay.closed()
        assert 7 not in svc._core.conn_of

        rank = Raw(svc.address)
        _, challenge = rank.next()
        rank.sock.sendall(msg.frame(msg.sign_hello(KEY, msg.hello(1, WORLD, "relays", "r0", "a:1", "b:2", "i"),
                                                   challenge.nonce)))
        assert rank.next()[0] == "welcome"
        rank.sock.sendall(msg.frame(rm.group_vote(1, True, [0, 1, 2])))  # a rank posing as a relay
        kind, refusal = rank.next()
        assert kind == "refusal" and "a group_vote frame comes from a relay only" in refusal.reason and rank.closed()
    finally:
        svc.close(linger_s=0.5)
