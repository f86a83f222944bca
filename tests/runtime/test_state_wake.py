"""The fetcher's reads woken a part at a time (`wire.Response` over `WokenReceiver`) on a real
loopback connection: the threshold is a part, never more than the body still has to come through
the socket (the bytes that came with the head excepted), and the last bytes of a body wake a
reader that had already taken the rest, also when they come while it sleeps."""

from __future__ import annotations

import http.client
import io
import os
import socket
import threading

import pytest

from ftar_kernels.woken_receive import WAKE_BYTES
from fthsdp.state import wire
from tests.sockets import asleep_in_kernel, loopback_pair, queued
from tests.waiting import wait_until

BOUND_S = 30.0


@pytest.fixture
def tcp():
    with loopback_pair() as pair:
        yield pair


def _response(sock: socket.socket, body: int, early: bytes = b"", timeout_s: float = BOUND_S) -> wire.Response:
    headers = http.client.parse_headers(io.BytesIO(f"Content-Length: {body}\r\n\r\n".encode()))
    return wire.Response(sock, 200, headers, early, timeout_s, WAKE_BYTES)


def _threshold(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


def test_the_threshold_is_a_part_but_never_more_than_the_socket_still_has_to_deliver(tcp):
    sender, reader = tcp
    # a source sends its whole body: a read may wait for a part of it beyond its own section
    threading.Thread(target=sender.sendall, args=(b"a" * (3 * WAKE_BYTES),), daemon=True).start()
    resp = _response(reader, 64 << 20)
    resp.read_exact(memoryview(bytearray(2 * WAKE_BYTES)))
    assert _threshold(reader) == WAKE_BYTES and resp.left == (64 << 20) - 2 * WAKE_BYTES
    with loopback_pair() as (sender, reader):
        data = os.urandom(1005)
        sender.sendall(data[10:])
        got = memoryview(bytearray(1005))
        resp = _response(reader, 1005, early=data[:10])
        resp.read_exact(got)
        assert _threshold(reader) == 995  # the 10 early bytes never come through the socket
        assert got.tobytes() == data and resp.left == 0


@pytest.mark.parametrize("views", [[3000], [1000, 2000]], ids=["one buffer", "a run of two"])
def test_the_last_bytes_of_a_body_wake_a_reader_that_took_the_rest_before_it_slept(tcp, views):
    """A blocking read with the threshold set copies what is queued, sleeps, and is woken only by
    a threshold's worth of *further* bytes: it sat here until its timeout (made long), though
    every byte had come."""
    sender, reader = tcp
    data = os.urandom(sum(views))
    resp = _response(reader, len(data), early=data[:100], timeout_s=BOUND_S * 4)
    sender.sendall(data[100:1500])
    wait_until(lambda: queued(reader) == 1400, BOUND_S, "the first part to be queued", every_s=0.001)
    bufs = [memoryview(bytearray(n)) for n in views]
    errors: list[BaseException] = []

    def read() -> None:
        try:
            resp.read_into(bufs)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=read)
    t.start()
    wait_until(lambda: asleep_in_kernel(t), BOUND_S, "the reader to sleep in its read", every_s=0.001)
    sender.sendall(data[1500:])
    t.join(BOUND_S)
    assert not t.is_alive(), "the read still waits with the whole body queued"
    assert not errors, errors
    assert b"".join(b.tobytes() for b in bufs) == data and resp.left == 0


def test_a_body_the_source_stops_sending_fails_within_the_timeout_naming_what_is_missing(tcp):
    sender, reader = tcp
    sender.sendall(b"x" * 100)
    resp = _response(reader, 10_000, timeout_s=0.2)
    with pytest.raises(wire.TransferError, match=r"state stream broke after 0 of 10000 bytes.*nothing arrived within 0.2 s"):
        resp.read_exact(memoryview(bytearray(10_000)))
    assert resp.left == 10_000
