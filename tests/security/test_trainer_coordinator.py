"""Attacks on a replica's coordinator port: the coordinator runs in its own process (a fresh one
for each test), legitimate ranks are real clients holding the job secret, strangers speak raw
frames on loopback sockets. Each attack is refused with a clear reason, the replica still
commits, and the process's threads and memory stay where they were."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from fthsdp.errors import ChannelError
from fthsdp.step import messages as msg
from fthsdp.step.client import CoordinatorClient
from protos import job_secret
from protos import replica_pb2 as rpb
from tests.runtime.test_coordinator_service import expect, round_trip
from tests.security.trainer_ports import STRANGER, PortProcess, coordinator_frames, dial, next_coordinator_frame
from tests.trainer_secret import SECRET

JOB, WORLD, HELLO_TIMEOUT_S = "sec-ports", 3, 10.0
KEY = SECRET.key(job_secret.PURPOSE_COORDINATOR)
COMMIT, RETRY = rpb.StepDecision.COMMIT, rpb.StepDecision.RETRY
#: the controller-call worker the first quorum starts; no stranger adds a thread
CONTROLLER_THREADS = 1


@pytest.fixture(scope="module")
def process(tmp_path_factory):
    server = PortProcess("coordinator", tmp_path_factory.mktemp("coordinator") / "coordinator.log", job_id=JOB,
                         world_size=WORLD, hello_timeout_s=HELLO_TIMEOUT_S)
    yield server
    server.close()


@pytest.fixture
def port(process):
    process.address = process.ask("reset")["address"]  # a replica of its own for every test
    return process


def hello_frame(rank: int, **fields) -> rpb.RankFrame:
    values = {**dict(world_size=WORLD, job_id=JOB, replica_id="r0", ftar_address=f"127.0.0.1:{7000 + rank}",
                     state_address=f"127.0.0.1:{8000 + rank}", incarnation="i"), **fields}
    return msg.hello(rank, values["world_size"], values["job_id"], values["replica_id"], values["ftar_address"],
                     values["state_address"], values["incarnation"])


def rank(port: PortProcess, r: int, timeout_s: float = 10.0) -> CoordinatorClient:
    return CoordinatorClient(port.address, r).connect(timeout_s, hello_frame(r), KEY)


def say_hello(port: PortProcess, frame: rpb.RankFrame, key: bytes | None, then: bytes = b"") -> list:
    """A raw connection: take the challenge, send `frame` tagged with `key` (and `then`); every
    frame the coordinator sent after the challenge, until it closed the connection."""
    with dial(port.host_port) as s:
        kind, challenge = next_coordinator_frame(s, msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES))
        assert kind == "challenge" and len(challenge.nonce) == 32
        s.sendall(msg.frame(msg.sign_hello(key, frame, challenge.nonce)) + then)
        return coordinator_frames(s)


def refusal(frames: list) -> str:
    assert [kind for kind, _ in frames] == ["refusal"], frames  # no welcome, no plan, nothing else
    return frames[0][1].reason


def test_a_strangers_hello_as_rank_2_gets_nothing_and_its_yes_votes_are_not_counted(port):
    r0, r1 = rank(port, 0), rank(port, 1)
    threads = port.threads()
    votes_yes = msg.frame(msg.begin(0)) + msg.frame(msg.vote(1, True, "", 0.0, 0)) + msg.frame(msg.vote(2, True, "", 0, 0))
    for key in (STRANGER.key(job_secret.PURPOSE_COORDINATOR), None):  # another job's secret; no tag at all
        reason = refusal(say_hello(port, hello_frame(2), key, then=votes_yes))
        assert "hello not authenticated" in reason and "replayed" in reason
    r2 = rank(port, 2)  # the real rank 2 is welcomed: the stranger bound nothing
    decisions = round_trip([r0, r1, r2], 0, [True, True, False])
    assert {d.outcome for d in decisions} == {RETRY} and "rank 2 voted no" in decisions[0].reason
    assert {d.outcome for d in round_trip([r0, r1, r2], 0, [True, True, True])} == {COMMIT}
    stats = port.ask("stats")
    assert (stats["connections"], stats["unauthenticated"]) == (3, 0)
    assert port.threads() <= threads + CONTROLLER_THREADS


@pytest.mark.parametrize("frame, why", [
    (hello_frame(77), "hello from rank 77 of world_size 3; this replica has ranks 0..2"),
    (hello_frame(-3), "hello from rank -3: ranks are >= 0"),
    (hello_frame(1, world_size=100), "hello from rank 1 of world_size 100"),
    (hello_frame(1, job_id="other-job"), "hello for job 'other-job' replica 'r0'"),
    (hello_frame(0), "rank 0 is already connected (a second process claims it)"),
])
def test_hellos_that_do_not_fit_the_replica_are_refused_even_with_the_secret(port, frame, why):
    r0 = rank(port, 0)
    assert why in refusal(say_hello(port, frame, KEY))
    ranks = [r0, rank(port, 1), rank(port, 2)]
    assert {d.outcome for d in round_trip(ranks, 0, [True] * WORLD)} == {COMMIT}


def test_a_recorded_hello_played_on_another_connection_is_refused(port):
    with dial(port.host_port) as first:  # a member's hello, tagged for this connection's challenge...
        _, challenge = next_coordinator_frame(first, msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES))
        recorded = msg.frame(msg.sign_hello(KEY, hello_frame(1), challenge.nonce))
    with dial(port.host_port) as second:  # ...is worth nothing on the next one
        kind, _ = next_coordinator_frame(second, msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES))
        second.sendall(recorded)
        assert "hello not authenticated" in refusal(coordinator_frames(second))
    ranks = [rank(port, k) for k in range(WORLD)]
    assert {d.outcome for d in round_trip(ranks, 0, [True] * WORLD)} == {COMMIT}


def test_oversized_frames_are_refused_without_being_buffered(port):
    rss = port.rss_mib()
    with dial(port.host_port) as s:  # 1 GiB announced before any hello, then 32 MiB pushed after it
        next_coordinator_frame(s, msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES))
        s.sendall(struct.pack(">I", 1 << 30))
        try:
            for _ in range(32):
                s.sendall(b"\0" * (1 << 20))
        except OSError:
            pass  # the coordinator hung up on us, as it should
        assert "a frame announces 1073741824 bytes; the limit is 2048" in refusal(coordinator_frames(s))
    big_hello = hello_frame(1)
    big_hello.hello.incarnation = "x" * 3000  # within a rank frame's bound, not within a hello's
    assert "the limit is 2048" in refusal(say_hello(port, big_hello, KEY))
    ranks = [rank(port, k) for k in range(WORLD)]
    assert {d.outcome for d in round_trip(ranks, 0, [True] * WORLD)} == {COMMIT}
    ranks[1]._sock.sendall(struct.pack(">I", 64 << 20))  # an authenticated rank that sends garbage is cut off
    with pytest.raises(ChannelError, match="a frame announces 67108864 bytes; the limit is 16384"):
        ranks[1].receive(10.0)
    ranks[0].send(msg.begin(1))
    assert "rank 1 left the replica" in expect(ranks[0], "no_plan").reason  # and the replica knows it
    assert port.rss_mib() < rss + 16


def test_silent_strangers_delay_no_hello_and_are_closed_at_their_deadline(port):
    deadline_s = 5.0
    port.address = port.ask(f"reset {deadline_s}")["address"]
    threads = port.threads()
    silent = [dial(port.host_port) for _ in range(3)]
    try:
        ranks = [rank(port, k, timeout_s=deadline_s / 2) for k in range(WORLD)]  # long before their deadline
        assert {d.outcome for d in round_trip(ranks, 0, [True] * WORLD)} == {COMMIT}
        for s in silent:
            frames = coordinator_frames(s)  # bounded by the socket's timeout
            assert [k for k, _ in frames] == ["challenge", "refusal"], frames
            assert frames[1][1].reason == f"no authenticated hello within {deadline_s:g}s"
    finally:
        for s in silent:
            s.close()
    assert port.ask("stats")["unauthenticated"] == 0 and port.threads() <= threads + CONTROLLER_THREADS


def test_unauthenticated_connections_are_bounded_and_ranks_get_in_after_the_flood(port):
    flood_timeout_s = 6.0  # long enough for a loaded machine to accept the whole flood first
    port.address = port.ask(f"reset {flood_timeout_s}")["address"]
    flood = [dial(port.host_port) for _ in range(WORLD + 64)]  # the most that may say hello at once
    try:
        for s in flood:  # each was accepted and challenged
            assert next_coordinator_frame(s, msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES))[0] == "challenge"
        with dial(port.host_port) as one_more:
            frames = coordinator_frames(one_more)
        assert [k for k, _ in frames] == ["refusal"] and frames[0][1].retry
        assert "too many connections are saying hello" in frames[0][1].reason
        stats = port.ask("stats")
        assert stats["unauthenticated"] == WORLD + 64
        # Ranks told to retry get in once the flood's deadline cut it off.
        ranks = [rank(port, k, timeout_s=flood_timeout_s + 15) for k in range(WORLD)]
        assert {d.outcome for d in round_trip(ranks, 0, [True] * WORLD)} == {COMMIT}
    finally:
        for s in flood:
            s.close()


def test_a_stranger_posing_as_the_coordinator_is_not_believed():
    fake = socket.create_server(("127.0.0.1", 0))

    def pose() -> None:
        conn, _ = fake.accept()
        with conn:
            conn.sendall(msg.frame(rpb.CoordinatorFrame(challenge=rpb.Challenge(nonce=b"n" * 32))))
            conn.recv(4096)
            conn.sendall(msg.frame(rpb.CoordinatorFrame(welcome=rpb.Welcome(auth=b"w" * 32))))
            conn.recv(4096)  # until the rank hangs up

    poser = threading.Thread(target=pose, daemon=True)
    poser.start()
    host, port = fake.getsockname()
    try:
        with pytest.raises(ChannelError, match="does not hold the job secret"):
            CoordinatorClient(f"{host}:{port}", 1).connect(10.0, hello_frame(1), KEY)
    finally:
        poser.join(10.0)
        fake.close()
