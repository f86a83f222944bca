"""A transport wrapper for tests: make the next call fail, or slow every send down.

    faults = Faults()
    ep = FtarEndpoint("127.0.0.1", 0, settings, transport=FaultyTransport(TcpTransport(), faults))
    faults.delay(0.05)                       # every data send waits 50 ms first
    faults.fail_next(RecoverableError("x"))  # the next send or receive raises this
"""

from __future__ import annotations

import threading

from .transport import Connection, Transport, WrappedConnection, WrappedTransport


class Faults:
    """Shared, thread-safe fault switches for every connection of one FaultyTransport."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: BaseException | None = None
        self.delay_s = 0.0

    def fail_next(self, error: BaseException) -> None:
        with self._lock:
            self._pending = error

    def delay(self, seconds: float) -> None:
        self.delay_s = seconds

    def take(self) -> BaseException | None:
        with self._lock:
            error, self._pending = self._pending, None
            return error


class FaultyConnection(WrappedConnection):
    def __init__(self, inner: Connection, faults: Faults) -> None:
        super().__init__(inner)
        self._faults = faults
        self._interrupted = threading.Event()

    def _before(self) -> None:
        error = self._faults.take()
        if error is not None:
            raise error

    def send_all(self, data, timeout_s: float) -> None:
        self._before()
        if self._faults.delay_s:
            self._interrupted.wait(self._faults.delay_s)  # cut short by interrupt()
        self.inner.send_all(data, timeout_s)

    def try_send(self, data) -> int:
        self._before()
        if self._faults.delay_s:
            return 0  # a slowed connection takes nothing at once: send_all waits, then sends
        return self.inner.try_send(data)

    def recv_exact(self, into: memoryview, timeout_s: float) -> None:
        self._before()
        self.inner.recv_exact(into, timeout_s)

    def recv_some(self, into: memoryview, timeout_s: float) -> int:
        self._before()
        return self.inner.recv_some(into, timeout_s)

    def interrupt(self) -> None:
        self._interrupted.set()
        self.inner.interrupt()

    def close(self) -> None:
        self._interrupted.set()
        self.inner.close()


class FaultyTransport(WrappedTransport):
    def __init__(self, inner: Transport, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        super().__init__(inner, lambda conn: FaultyConnection(conn, self.faults))
