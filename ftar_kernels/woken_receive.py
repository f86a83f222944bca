"""Receives woken once a useful amount has arrived (SO_RCVLOWAT), without the kernel's trap.

A thread blocked in `recv` is woken at every arrival, about every 64 KiB on loopback: a context
switch for the reader and a cross-core wake-up the sending side pays for. With SO_RCVLOWAT the
kernel wakes the reader only once that many bytes are queued (one 1 GiB catch-up: 211-213 ms
against 238-266; FTAR at 4 ranks 0.93-1.04 of the TCP ring against 0.85-0.89; docs/architecture.md,
"Receives woken a part at a time").

The trap: a *blocking* `recv` that has copied part of what it asked for and then sleeps is woken
only when SO_RCVLOWAT *more* bytes are queued, not when its own request is complete. With the
threshold set to the bytes still due, the rest of them arrive and the reader sleeps on until its
timeout, while the sender, in a ring, waits for it (the stall this module was written after;
tests/ftar/test_woken_receive.py puts a reader exactly there). So the wait here is a
`poll()`, which copies nothing, so "the threshold is queued" means exactly "the bytes due are
here", and the read after it takes what is there without blocking. The threshold is never set
above what the peer still owes (`due`), so it is always reached, or the peer closes or fails,
which wakes the poll too.
"""

from __future__ import annotations

import select
import socket
import time

#: wake a reader once this much is queued: fewer wake-ups than per arrival, still a small part of
#: a chunk (measured: docs/architecture.md, "Receives woken a part at a time")
WAKE_BYTES = 512 << 10


class WokenReceiver:
    """The receiving side of one connected socket. Not thread-safe: one reading thread."""

    def __init__(self, sock: socket.socket, wake_bytes: int = WAKE_BYTES) -> None:
        if not isinstance(wake_bytes, int) or wake_bytes < 1:
            raise ValueError(f"wake_bytes must be a positive byte count, got {wake_bytes!r}.")
        self._sock = sock
        self._wake_bytes = wake_bytes
        self._threshold = 0  # what the socket's SO_RCVLOWAT was last set to (0: never; the kernel's is 1)
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)  # errors and hang-ups are always reported

    @property
    def threshold(self) -> int:
        return self._threshold

    def receive(self, into: memoryview | list[memoryview], due: int, timeout_s: float) -> int:
        """Wait until min(`due`, wake_bytes) bytes are queued, or the peer closed or failed, then
        take what is there, up to the size of `into` (one buffer, or several filled in order),
        without blocking. `due`: how many bytes the peer still owes for certain (at least 1).
        Returns how many bytes were taken, 0 when the peer closed. TimeoutError when nothing
        arrived within `timeout_s`; OSError when the connection failed."""
        want = max(1, min(due, self._wake_bytes))
        if want != self._threshold:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            self._threshold = want
        deadline = time.monotonic() + timeout_s
        while True:
            left_ms = max(0, round((deadline - time.monotonic()) * 1000))
            if not self._poll.poll(left_ms):
                raise TimeoutError(f"nothing arrived within {timeout_s} s")
            try:
                if isinstance(into, list):
                    return self._sock.recvmsg_into(into, 0, socket.MSG_DONTWAIT)[0]
                return self._sock.recv_into(into, len(into), socket.MSG_DONTWAIT)
            except BlockingIOError:  # ready, then taken by nobody else: only a spurious wake-up
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"nothing arrived within {timeout_s} s") from None
