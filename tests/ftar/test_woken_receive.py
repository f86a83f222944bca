"""Receives woken once a useful amount is queued (SO_RCVLOWAT), on real loopback connections.

The trap `WokenReceiver` avoids: a blocking recv that copied part of what it asked for sleeps until
the threshold's worth of *further* bytes arrives, so the rest of a message can sit in the queue
while the reader sleeps. The first test puts a reader exactly there: part of the due bytes taken
into the queue before it reads, the rest sent only once it sleeps in the kernel.
"""

from __future__ import annotations

import random
import socket
import threading

import pytest
import torch

from ftar_kernels import FtarEndpoint, FtarSettings
from ftar_kernels.woken_receive import WAKE_BYTES, WokenReceiver

from tests import waiting
from tests.sockets import asleep_in_kernel, loopback_pair, queued

from .cluster import KEY, parallel

BOUND_S = 30.0  # every wait here is bounded by this; nothing here waits it out when it works


@pytest.fixture
def pair():
    with loopback_pair() as p:
        yield p


def wait_until(condition, what: str) -> None:
    waiting.wait_until(condition, BOUND_S, what, every_s=0.001)


def read_exactly(receiver: WokenReceiver, into: memoryview, timeout_s: float) -> None:
    got = 0
    while got < len(into):
        k = receiver.receive(into[got:], len(into) - got, timeout_s)
        assert k, "the peer closed early"
        got += k


def test_a_reader_that_finds_part_of_what_is_due_wakes_when_the_rest_arrives(pair):
    sender, reader = pair
    payload = random.Random(1).randbytes(400_000)
    sender.sendall(payload[:150_000])
    wait_until(lambda: queued(reader) == 150_000, "the first part to be queued")
    into = memoryview(bytearray(len(payload)))
    receiver = WokenReceiver(reader, wake_bytes=len(payload))
    errors: list[BaseException] = []

    def read() -> None:
        try:
            read_exactly(receiver, into, timeout_s=BOUND_S * 4)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=read)
    t.start()
    wait_until(lambda: asleep_in_kernel(t), "the reader to sleep in its receive")
    assert receiver.threshold == len(payload)
    sender.sendall(payload[150_000:])
    t.join(BOUND_S)
    assert not t.is_alive(), "the reader slept on with every byte it waits for queued"
    assert not errors, errors
    assert bytes(into) == payload


def test_the_threshold_is_a_part_and_never_more_than_is_due(pair):
    sender, reader = pair
    receiver = WokenReceiver(reader)
    lowat = lambda: reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)  # noqa: E731
    sender.sendall(b"x" * 10)
    assert receiver.receive(memoryview(bytearray(10)), 10, BOUND_S) == 10
    assert lowat() == receiver.threshold == 10
    sender.sendall(b"y")
    assert receiver.receive(memoryview(bytearray(4)), 1, BOUND_S) == 1  # a credit: woken by one byte
    assert lowat() == 1
    payload = random.Random(2).randbytes(3 * WAKE_BYTES)
    threading.Thread(target=sender.sendall, args=(payload,), daemon=True).start()
    into = memoryview(bytearray(len(payload)))
    read_exactly(receiver, into, BOUND_S)
    assert bytes(into) == payload
    assert lowat() == receiver.threshold <= WAKE_BYTES


def test_a_receive_fills_several_buffers_in_order(pair):
    sender, reader = pair
    payload = bytes(range(256)) * 40
    sender.sendall(payload)
    wait_until(lambda: queued(reader) == len(payload), "the payload to be queued")
    parts = [memoryview(bytearray(n)) for n in (1000, 3, 9237)]
    assert WokenReceiver(reader).receive(parts, len(payload), BOUND_S) == len(payload)
    assert b"".join(bytes(p) for p in parts) == payload


def test_a_wait_is_bounded_and_leaves_the_connection_usable(pair):
    sender, reader = pair
    receiver = WokenReceiver(reader)
    with pytest.raises(TimeoutError, match=r"nothing arrived within 0.05 s"):
        receiver.receive(memoryview(bytearray(8)), 8, 0.05)
    sender.sendall(b"12345678")
    into = memoryview(bytearray(8))
    read_exactly(receiver, into, BOUND_S)
    assert bytes(into) == b"12345678"


def test_a_peer_that_closes_owing_bytes_wakes_the_reader_below_the_threshold(pair):
    sender, reader = pair
    receiver = WokenReceiver(reader)
    sender.sendall(b"z" * 1000)
    sender.close()  # it promised 100,000
    into = memoryview(bytearray(100_000))
    assert receiver.receive(into, 100_000, BOUND_S) == 1000
    assert receiver.receive(into[1000:], 99_000, BOUND_S) == 0


def test_a_shutdown_from_another_thread_wakes_a_waiting_reader(pair):
    _, reader = pair
    receiver = WokenReceiver(reader)
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(receiver.receive(memoryview(bytearray(64)), 64, BOUND_S * 4)))
    t.start()
    wait_until(lambda: asleep_in_kernel(t) or not t.is_alive(), "the reader to wait")
    reader.shutdown(socket.SHUT_RDWR)
    t.join(BOUND_S)
    assert not t.is_alive() and out == [0]


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_a_bad_wake_size_is_refused_naming_it(pair, bad):
    with pytest.raises(ValueError, match=f"wake_bytes must be a positive byte count, got {bad!r}"):
        WokenReceiver(pair[1], wake_bytes=bad)


def test_all_reduces_of_many_sizes_never_wait_out_a_timeout():
    """Chunks that arrive in many segments, ending at every kind of offset. With a blocking
    receive behind the threshold, an operation sat until its socket timeout (then went on) within
    a few dozen of these; here that timeout is four times the bound each operation is held to."""
    settings = FtarSettings(chunk_bytes=1 << 20, chunks_in_flight=2, timeout_s=BOUND_S * 4, connect_timeout_s=10.0,
                            auth_key=KEY)
    eps = [FtarEndpoint("127.0.0.1", 0, settings) for _ in range(2)]
    try:
        members = [e.address for e in eps]
        parallel(*[lambda e=e: e.configure("woken", 1, members) for e in eps])
        rng = random.Random(3)
        for _ in range(24):
            n = rng.randint(100_000, 1_500_000)
            tensors = [torch.full((n,), float(r + 1)) for r in range(2)]
            handles = [e.allreduce(t) for e, t in zip(eps, tensors)]
            for h in handles:
                h.wait(BOUND_S)
            assert all(bool((t == 3.0).all()) for t in tensors), f"a wrong sum at {n} elements"
    finally:
        for e in eps:
            e.close()
