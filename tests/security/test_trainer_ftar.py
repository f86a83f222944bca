"""Attacks on FTAR's hello: two real endpoints in worker processes (tests/ftar/cluster.py), each
holding the job's key; strangers dial them on loopback. Silent connections delay no
reconfigure, a stranger cannot take a peer's parked place, a recorded hello is worth nothing on
a new connection, and a flood of connections costs a bounded number of threads."""

from __future__ import annotations

import itertools
import socket

import pytest

from ftar_kernels import auth
from ftar_kernels.handshake import challenge_nonce, hello, judge_answer, read_message, send_message
from ftar_kernels.membership import MAX_PENDING_HELLOS
from ftar_kernels.transport import TcpConnection, split_address
from protos import job_secret
from tests.ftar.cluster import KEY, Cluster, expected_sum, tensor_bytes
from tests.security.trainer_ports import STRANGER
from tests.waiting import wait_for, wait_for_blocking, wait_until

CONNECT_TIMEOUT_S = 4.0
GROUP = "sec-ports/rank0"
_generations = itertools.count(1)


@pytest.fixture(scope="module")
def ring():
    cluster = Cluster(2, chunk_bytes=4096, chunks_in_flight=2, timeout_s=10.0, connect_timeout_s=CONNECT_TIMEOUT_S)
    try:
        assert all(a.ok for a in cluster.configure([0, 1], GROUP, next(_generations)))
        yield cluster
    finally:
        cluster.close()


def sums_right(cluster: Cluster, seed: int) -> bool:
    answers = cluster.allreduce([0, 1], 5000, "float32", seed)
    assert all(a.ok for a in answers), answers
    return answers[0].value["data"] == answers[1].value["data"] == tensor_bytes(expected_sum(5000, "float32", seed, 2))


def stranger(address: str) -> tuple[TcpConnection, bytes]:
    """A raw connection to an endpoint, and the challenge it was sent."""
    sock = socket.create_connection(split_address(address), timeout=CONNECT_TIMEOUT_S + 10)
    conn = TcpConnection(sock, address)
    return conn, challenge_nonce(read_message(conn, 10.0))


def claim(address: str, key: bytes | None, generation: int, sender: str) -> dict:
    """Dial `address` as `sender` with `key`; the endpoint's answer."""
    conn, nonce = stranger(address)
    try:
        send_message(conn, hello(key, GROUP, generation, sender, address, nonce, auth.nonce()), 10.0)
        return read_message(conn, 10.0)
    finally:
        conn.close()


async def test_two_silent_connections_per_endpoint_do_not_break_the_next_reconfigure(ring):
    threads = [a.value for a in ring.run([0, 1], "threads", (), ())]
    silent = [socket.create_connection(split_address(ring.addresses[i]), timeout=CONNECT_TIMEOUT_S + 10)
              for i in (0, 1, 0, 1)]
    try:
        assert all(a.ok for a in ring.configure([0, 1], GROUP, next(_generations))), "reconfigure failed"
        assert sums_right(ring, 1)
        for s in silent:  # each was challenged, then closed at its deadline
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            assert b'"kind":"challenge"' in data
    finally:
        for s in silent:
            s.close()
    # the endpoint closes a connection just before it forgets it: wait (bounded) for the bookkeeping
    await wait_for_blocking(lambda: [a.value for a in ring.run([0, 1], "pending", (), ())] == [0, 0], 10,
                            "no hello pending on either endpoint")
    await wait_for_blocking(lambda: [a.value for a in ring.run([0, 1], "threads", (), ())] == threads, 10,
                            f"the endpoints back to {threads} threads")


async def test_a_stranger_claiming_rank_0_after_its_real_hello_cannot_replace_it(ring):
    gen = next(_generations)
    first, second = ring.addresses
    ring.send(0, "configure", GROUP, gen, [first, second])  # worker 0 dials worker 1 and parks there

    def parked():
        return [gen, first] in ring.run([1], "parked", ())[0].value

    await wait_for(parked, 20.0, "worker 0's hello parked at worker 1")
    for key in (STRANGER.key(job_secret.PURPOSE_FTAR), None):  # another job's key; no tag at all
        answer = claim(second, key, gen, first)
        assert answer["ok"] is False and "hello not authenticated" in answer["reason"], answer
    assert parked()
    ring.send(1, "configure", GROUP, gen, [first, second])
    assert [ring.answer(i).ok for i in (0, 1)] == [True, True]
    assert sums_right(ring, 2)  # the ring holds the real rank 0's connection


def test_a_recorded_hello_is_refused_on_a_new_connection_and_an_answer_proves_the_acceptor(ring):
    target, member = ring.addresses[1], ring.addresses[0]
    conn, nonce = stranger(target)  # a member's hello for this connection's challenge...
    recorded = hello(KEY, GROUP, 0, member, target, nonce, auth.nonce())
    conn.close()
    conn, _ = stranger(target)  # ...played on the next connection
    try:
        send_message(conn, recorded, 10.0)
        answer = read_message(conn, 10.0)
    finally:
        conn.close()
    assert answer["ok"] is False and "hello not authenticated" in answer["reason"]
    # The same member tagging this connection's own challenge gets past the tag (and is refused
    # only as stale: generation 0 is long gone), in an answer tagged with the job's key.
    conn, nonce = stranger(target)
    try:
        own = auth.nonce()
        fresh = hello(KEY, GROUP, 0, member, target, nonce, own)
        send_message(conn, fresh, 10.0)
        answer = read_message(conn, 10.0)
    finally:
        conn.close()
    assert answer["ok"] is False and "generation 0 is stale" in answer["reason"]
    assert judge_answer(KEY, answer, fresh, own).reason == answer["reason"]  # authentic: the tag verified
    assert "not authenticated" in judge_answer(STRANGER.key(job_secret.PURPOSE_FTAR), answer, fresh, own).reason
    assert sums_right(ring, 3)


def test_a_flood_of_connections_costs_a_bounded_number_of_threads(ring):
    threads = ring.run([1], "threads", ())[0].value
    flood = [socket.create_connection(split_address(ring.addresses[1]), timeout=CONNECT_TIMEOUT_S + 10)
             for _ in range(3 * MAX_PENDING_HELLOS)]
    try:
        for s in flood:
            s.recv(1)  # accepted (its challenge began), or already pushed out
        assert ring.run([1], "pending", ())[0].value <= MAX_PENDING_HELLOS
        # the threads of hellos pushed out end a moment after their sockets close: what stays
        # is bounded (a flood that kept a thread per connection would stay at 3x the bound)
        wait_until(lambda: ring.run([1], "threads", ())[0].value <= threads + MAX_PENDING_HELLOS, 10.0,
                   f"worker 1's threads back within {threads} + {MAX_PENDING_HELLOS}")
        assert all(a.ok for a in ring.configure([0, 1], GROUP, next(_generations))), "reconfigure failed"
        assert sums_right(ring, 4)
    finally:
        for s in flood:
            s.close()
