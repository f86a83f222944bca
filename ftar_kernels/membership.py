"""Building one rank's ring connections for a (group, generation, members) membership.

An acceptor thread (started on the first configure, never in a constructor) answers every dialler
at once: a stale or foreign peer is refused with a reason, anything else is acknowledged and
parked until `connect_ring` for that generation claims it as the left neighbour. `connect_ring`
dials the right neighbour, checks its answer, and claims the left one, all within one deadline.
"""

from __future__ import annotations

import logging
import threading
import time

from .errors import FatalError, FtarError, RecoverableError
from .handshake import hello, judge_hello, read_message, send_message
from .ring_run import RingLinks
from .transport import Connection, Listener, Transport

log = logging.getLogger("ftar_kernels")
MAX_PARKED = 64


class Membership:
    def __init__(self, listener: Listener, transport: Transport, connect_timeout_s: float) -> None:
        self._listener = listener
        self._transport = transport
        self._connect_timeout_s = connect_timeout_s
        self._cond = threading.Condition()
        self._parked: dict[tuple[int, str], Connection] = {}
        self._group_id: str | None = None
        self._generation: int | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def address(self) -> str:
        return self._listener.address

    def start(self) -> None:
        with self._cond:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._accept_loop, name="ftar-accept", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            thread = self._thread
        self._listener.wake()
        if thread is not None:
            thread.join(self._connect_timeout_s + 5.0)
        with self._cond:
            for conn in self._parked.values():
                conn.close()
            self._parked.clear()
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stopping:
            conn = self._listener.accept(1.0)
            if conn is None:
                continue
            try:
                self._admit(conn)
            except (FtarError, OSError, ValueError) as exc:
                log.info("%s dropped an incoming connection from %s: %s", self.address, conn.peer, exc)
                conn.close()

    def _admit(self, conn: Connection) -> None:
        message = read_message(conn, self._connect_timeout_s)
        with self._cond:
            verdict = judge_hello(message, self._group_id, self._generation)
        if not verdict.accept:
            log.info("%s refused %s: %s", self.address, message.get("from"), verdict.reason)
            send_message(conn, {"ok": False, "reason": verdict.reason, "fatal": verdict.fatal},
                         self._connect_timeout_s)
            conn.close()
            return
        send_message(conn, {"ok": True}, self._connect_timeout_s)
        with self._cond:
            if self._stopping or len(self._parked) >= MAX_PARKED:
                conn.close()
                return
            old = self._parked.pop((message["generation"], str(message.get("from"))), None)
            if old is not None:
                old.close()
            self._parked[(message["generation"], str(message.get("from")))] = conn
            self._cond.notify_all()

    def advance(self, group_id: str, generation: int) -> None:
        """Serve (group_id, generation) from now on; drop parked peers of older generations."""
        with self._cond:
            self._group_id, self._generation = group_id, generation
            for key in [k for k in self._parked if k[0] < generation]:
                self._parked.pop(key).close()

    def connect_ring(self, group_id: str, generation: int, left: str, right: str) -> RingLinks:
        deadline = time.monotonic() + self._connect_timeout_s

        def remaining() -> float:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise RecoverableError(
                    f"ring for {group_id!r} generation {generation} not connected within "
                    f"{self._connect_timeout_s} s")
            return left_s

        right_conn = self._transport.dial(right, remaining())
        try:
            send_message(right_conn, hello(group_id, generation, self.address, right), remaining())
            answer = read_message(right_conn, remaining())
            if not answer.get("ok"):
                kind = FatalError if answer.get("fatal") else RecoverableError
                raise kind(f"peer {right} refused {self.address} for {group_id!r} generation "
                           f"{generation}: {answer.get('reason')}")
            left_conn = self._claim(generation, left, deadline)
        except BaseException:
            right_conn.close()
            raise
        return RingLinks(left_conn, right_conn)

    def _claim(self, generation: int, left: str, deadline: float) -> Connection:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: (generation, left) in self._parked or self._stopping,
                max(0.0, deadline - time.monotonic()))
            if not ok or self._stopping:
                raise RecoverableError(
                    f"left neighbour {left} did not connect to {self.address} for generation "
                    f"{generation} within {self._connect_timeout_s} s")
            return self._parked.pop((generation, left))
