"""Building one rank's ring connections for a (group, generation, members) membership.

An acceptor thread (started on the first configure, never in a constructor) takes every
incoming connection and hands it to a hello thread of its own, so a silent or slow dialler
holds up nobody else: each hello has its deadline (connect_timeout_s), at most
MAX_PENDING_HELLOS wait at once (a new one pushes out the oldest), and the acceptor closes
any that overstays. A hello is authenticated first (handshake.py); a stale or foreign one is
refused with a reason; anything else is acknowledged and parked under its authenticated
identity (generation, the dialler's address) until `connect_ring` for that generation claims
it as the left neighbour. Only another authenticated hello of the same identity (the same peer
dialling again) can take a parked connection's place. `connect_ring` dials the right
neighbour, authenticates it, and claims the left one, all within one deadline.
"""

from __future__ import annotations

import logging
import threading
import time

from . import auth
from .errors import FatalError, FtarError, RecoverableError
from .handshake import (MAX_HELLO_BYTES, answer, challenge, challenge_nonce, hello, judge_answer, judge_hello,
                        read_message, send_message)
from .ring_run import RingLinks
from .transport import Connection, Listener, Transport

log = logging.getLogger("ftar_kernels")
MAX_PARKED = 64
MAX_PENDING_HELLOS = 32


class Membership:
    def __init__(self, listener: Listener, transport: Transport, connect_timeout_s: float,
                 auth_key: bytes | None = None) -> None:
        self._listener = listener
        self._transport = transport
        self._connect_timeout_s = connect_timeout_s
        self._key = auth_key or None
        self._cond = threading.Condition()
        self._parked: dict[tuple[int, str], Connection] = {}
        self._pending: dict[Connection, float] = {}  # hellos being read -> their deadline (oldest first)
        self._hello_threads: set[threading.Thread] = set()
        self._group_id: str | None = None
        self._generation: int | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def address(self) -> str:
        return self._listener.address

    @property
    def pending_hellos(self) -> int:
        with self._cond:
            return len(self._pending)

    def start(self) -> None:
        with self._cond:
            if self._thread is None and not self._stopping:
                if self._key is None:
                    log.warning("%s accepts peers WITHOUT authentication (no auth_key)", self.address)
                self._thread = threading.Thread(target=self._accept_loop, name="ftar-accept", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            thread = self._thread
            for conn in self._pending:
                conn.interrupt()
            hello_threads = list(self._hello_threads)
        self._listener.wake()
        if thread is not None:
            thread.join(self._connect_timeout_s + 5.0)
        for t in hello_threads:
            t.join(self._connect_timeout_s + 5.0)
        with self._cond:
            for conn in self._parked.values():
                conn.close()
            self._parked.clear()
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stopping:
            conn = self._listener.accept(min(1.0, self._connect_timeout_s))
            self._close_overdue(time.monotonic())
            if conn is not None:
                self._start_hello(conn)

    def _close_overdue(self, now: float) -> None:
        """A hello past its deadline is cut off, however slowly its bytes still trickle in."""
        with self._cond:
            for conn, deadline in self._pending.items():
                if now > deadline:
                    conn.interrupt()

    def _start_hello(self, conn: Connection) -> None:
        with self._cond:
            if self._stopping:
                conn.close()
                return
            if len(self._pending) >= MAX_PENDING_HELLOS:
                oldest = next(iter(self._pending))
                log.info("%s: %d hellos pending; dropping the oldest, from %s", self.address, len(self._pending),
                         oldest.peer)
                del self._pending[oldest]
                oldest.interrupt()
            self._pending[conn] = time.monotonic() + self._connect_timeout_s
            thread = threading.Thread(target=self._hello_thread, args=(conn,), name="ftar-hello", daemon=True)
            self._hello_threads.add(thread)
        thread.start()

    def _hello_thread(self, conn: Connection) -> None:
        try:
            self._admit(conn)
        except (FtarError, OSError, ValueError) as exc:
            log.info("%s dropped an incoming connection from %s: %s", self.address, conn.peer, exc)
            conn.close()
        finally:
            with self._cond:
                self._pending.pop(conn, None)
                self._hello_threads.discard(threading.current_thread())

    def _admit(self, conn: Connection) -> None:
        deadline = time.monotonic() + self._connect_timeout_s

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RecoverableError(f"no hello within {self._connect_timeout_s} s")
            return left

        nonce = auth.nonce()
        send_message(conn, challenge(nonce), remaining())
        message = read_message(conn, remaining(), MAX_HELLO_BYTES)
        with self._cond:
            verdict = judge_hello(message, self._group_id, self._generation, self._key, nonce)
        send_message(conn, answer(self._key, verdict, message), remaining())
        if not verdict.accept:
            log.info("%s refused a hello from %s: %s", self.address, conn.peer, verdict.reason)
            conn.close()
            return
        identity = (message["generation"], message["from"])
        with self._cond:
            if self._stopping or (identity not in self._parked and len(self._parked) >= MAX_PARKED):
                conn.close()
                return
            old = self._parked.pop(identity, None)
            if old is not None:  # the same authenticated peer dialled again: its newer connection counts
                old.close()
            self._parked[identity] = conn
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
            acceptor_nonce = challenge_nonce(read_message(right_conn, remaining(), MAX_HELLO_BYTES))
            own_nonce = auth.nonce()
            sent = hello(self._key, group_id, generation, self.address, right, acceptor_nonce, own_nonce)
            send_message(right_conn, sent, remaining())
            verdict = judge_answer(self._key, read_message(right_conn, remaining(), MAX_HELLO_BYTES), sent, own_nonce)
            if not verdict.accept:
                kind = FatalError if verdict.fatal else RecoverableError
                raise kind(f"peer {right} refused {self.address} for {group_id!r} generation "
                           f"{generation}: {verdict.reason}")
            left_conn = self._claim(generation, left, deadline)
        except ValueError as exc:  # not a challenge, not JSON: whoever listens there is no FTAR peer
            right_conn.close()
            raise RecoverableError(f"peer {right} did not speak the FTAR hello: {exc}") from None
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
