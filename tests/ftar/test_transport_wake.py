"""FTAR's TCP receives are woken a part at a time (`WAKE_BYTES`, SO_RCVLOWAT), never for more
than the call still waits for: a neighbour that sent all it owes and now waits for a credit
sends nothing more, so a threshold above the bytes still due would hold the receive until its
timeout. Real loopback connections; the timeout is made long so that such a hold shows (when
the bytes come after the receive slept; when they come first it returns at once either way, so
the threshold it set is read back too)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from ftar_kernels.transport import WAKE_BYTES, TcpConnection

LONG_S = 120.0


@pytest.fixture
def conns():
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    sender, receiver = TcpConnection(a, "receiver"), TcpConnection(b, "sender")
    receiver.raw = b  # the receiving socket itself, to read its threshold back
    yield sender, receiver
    sender.close()
    receiver.close()


@pytest.mark.parametrize("n", [1, 1000, WAKE_BYTES - 1, WAKE_BYTES, WAKE_BYTES + 1, 3 * WAKE_BYTES + 100])
def test_a_receive_returns_once_the_bytes_it_waits_for_are_in_although_nothing_follows(conns, n):
    sender, receiver = conns
    data = os.urandom(n)
    into = memoryview(bytearray(n))
    done = threading.Event()

    def receive() -> None:
        receiver.recv_exact(into, LONG_S)
        done.set()

    threading.Thread(target=receive, daemon=True).start()
    for lo in range(0, n, 70000):  # odd-sized arrivals, then silence (as a neighbour awaiting a credit)
        sender.send_all(memoryview(data)[lo:lo + 70000], LONG_S)
    assert done.wait(30.0), f"the receive of {n} bytes still waits for bytes nobody will send"
    assert into.tobytes() == data
    threshold = receiver.raw.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
    assert threshold == n if n <= WAKE_BYTES else 1 <= threshold <= WAKE_BYTES  # the last call's


def test_a_credit_byte_wakes_the_waiting_sender_after_a_large_receive_on_the_same_connection(conns):
    sender, receiver = conns
    big = memoryview(bytearray(2 * WAKE_BYTES))
    threading.Thread(target=sender.send_all, args=(bytes(len(big)), LONG_S), daemon=True).start()
    receiver.recv_exact(big, LONG_S)
    got, done = memoryview(bytearray(8)), threading.Event()
    count: list[int] = []

    def credit() -> None:
        count.append(receiver.recv_some(got, LONG_S))
        done.set()

    threading.Thread(target=credit, daemon=True).start()
    sender.send_all(b"\x01", LONG_S)
    assert done.wait(30.0), "a one-byte credit did not wake the receive"
    assert count == [1] and got[0] == 1
