"""The fetcher's wake-ups (`wire.Response.wake_at`, SO_RCVLOWAT) on a real loopback TCP
connection: the kernel wakes a blocked read once a part's worth of bytes waits, never waits for
more than the body still has to send (the bytes that came with the head excepted), and a read of
fewer bytes than that returns as soon as they are there."""

from __future__ import annotations

import http.client
import io
import os
import socket
import threading

import pytest

from fthsdp.state import wire
from fthsdp.state.stream import PART_BYTES


@pytest.fixture
def tcp():
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        reader, _ = server.accept()
    wire.use_kernel_timeouts(reader, 5.0)  # a read that waited for bytes that never come fails, not hangs
    yield sender, reader
    sender.close()
    reader.close()


def _response(sock: socket.socket, body: int, early: bytes = b"") -> wire.Response:
    headers = http.client.parse_headers(io.BytesIO(f"Content-Length: {body}\r\n\r\n".encode()))
    return wire.Response(sock, 200, headers, early)


def _wake_bytes(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


def test_the_threshold_is_a_part_but_never_more_than_the_kernel_still_has_to_deliver(tcp):
    _, reader = tcp
    assert _wake_bytes(reader) == 1
    _response(reader, 64 << 20).wake_at(PART_BYTES)
    assert _wake_bytes(reader) == PART_BYTES
    _response(reader, 1005, early=b"x" * 10).wake_at(PART_BYTES)
    assert _wake_bytes(reader) == 995  # the 10 early bytes will never come through the socket
    _response(reader, 10, early=b"x" * 10).wake_at(PART_BYTES)
    assert _wake_bytes(reader) == 1


def test_the_last_bytes_of_a_body_arrive_although_fewer_than_a_part_are_left(tcp):
    """A threshold above what is left would hold the read until its kernel timeout (made long
    here), though every byte had come."""
    sender, reader = tcp
    wire.use_kernel_timeouts(reader, 120.0)
    data = os.urandom(3000)
    resp = _response(reader, len(data), early=data[:100])
    resp.wake_at(PART_BYTES)
    first, second = memoryview(bytearray(1000)), memoryview(bytearray(2000))
    done = threading.Event()

    def read() -> None:
        resp.read_into([first, second])
        done.set()

    threading.Thread(target=read, daemon=True).start()
    for lo in range(100, len(data), 700):
        sender.sendall(data[lo:lo + 700])
    assert done.wait(30.0), "the read still waits for bytes the body does not have"
    assert first.tobytes() + second.tobytes() == data and resp.left == 0


def test_a_read_of_fewer_bytes_than_the_threshold_returns_once_they_are_there(tcp):
    sender, reader = tcp
    resp = _response(reader, 64 << 20)
    resp.wake_at(PART_BYTES)
    sender.sendall(b"a small run")
    got = memoryview(bytearray(11))
    resp.read_exact(got)
    assert got.tobytes() == b"a small run" and resp.left == (64 << 20) - 11
