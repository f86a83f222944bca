"""What allreduce() returns: a handle to wait on, and the operation's stats."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from .errors import FtarError, RecoverableError


@dataclass(frozen=True)
class OpStats:
    """bytes: the tensor's size in bytes. seconds: from the start of this operation's execution
    (after earlier queued ones) to its end. retries: how many times FTAR re-attempted the
    operation internally; FTAR never retries by itself (the caller reconfigures and calls again),
    so this is always 0 today and exists for callers that count their own attempts.
    wire_bytes: bytes this rank sent to its right neighbour. chunks: chunks this rank sent."""

    bytes: int
    seconds: float
    retries: int = 0
    wire_bytes: int = 0
    chunks: int = 0


class AllReduceHandle:
    """Completion of one asynchronous all-reduce; `wait` returns OpStats or raises."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._stats: OpStats | None = None
        self._error: FtarError | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the operation ended (at once when it has): on the thread that
        ends it, so it must be quick and must not raise (a waiter writes a byte to a wake pipe)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def wait(self, timeout_s: float | None = None) -> OpStats:
        """Block until the operation ends (at most timeout_s if given).

        Raises RecoverableError if it failed recoverably or did not end within timeout_s (the
        operation then still runs until its own bounded waits end it; reconfigure to cancel it),
        FatalError if it failed fatally."""
        if not self._done.wait(timeout_s):
            raise RecoverableError(f"all-reduce did not finish within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self._stats

    def _succeed(self, stats: OpStats) -> None:
        self._stats = stats
        self._end()

    def _fail(self, error: FtarError) -> None:
        self._error = error
        self._end()

    def _end(self) -> None:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    @classmethod
    def failed(cls, error: FtarError) -> "AllReduceHandle":
        handle = cls()
        handle._fail(error)
        return handle
