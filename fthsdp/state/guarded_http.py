"""A threading HTTP server whose every connection is bounded: count, time to authenticate, I/O.

- Connections that have not authenticated yet have a budget of their own,
  `max_unauthenticated`: when it is full, a newcomer takes the place of the oldest of them
  that has sent nothing yet (of the oldest of all when every one has spoken), which is shut
  down unanswered. So strangers who open connections and send nothing never keep a fetcher
  out, however many they open and however fast: a real fetcher sends its signed request in
  the same breath as it connects, so it has spoken before a newer connection could push it
  out, and only a stranger that speaks competes with it (each try costing it a connection).
- A connection that has not authenticated (`authenticated(sock)`, called by the handler once
  its request passed) within `hello_timeout_s` of its arrival is shut down, however slowly its
  bytes trickle in: the server's loop looks every poll interval (`service_actions`).
- At most `max_connections` authenticated connections are served at once (one thread each):
  `authenticated` says False for one more, and the handler answers it "busy".
- Every socket read and write is bounded by `io_timeout_s`, so a peer that stops reading
  fails the write blocked on it.
- `cut_off(sock)`-marked streams can be shut down at once (`cut_streams`): a transfer whose
  reader stalls cannot keep the server from moving on.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from http.server import ThreadingHTTPServer

log = logging.getLogger(__name__)


class GuardedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    #: the listen backlog: a flood is accepted (and turned away) at once, instead of filling a
    #: short queue that makes a real fetcher wait for its SYN to be sent again
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler, max_connections: int, max_unauthenticated: int,
                 hello_timeout_s: float, io_timeout_s: float) -> None:
        self.max_connections, self.max_unauthenticated = max_connections, max_unauthenticated
        self.hello_timeout_s, self.io_timeout_s = hello_timeout_s, io_timeout_s
        self._lock = threading.Lock()
        #: not yet authenticated -> when it must have (in arrival order, so the first is the oldest)
        self._due: dict[socket.socket, float] = {}
        self._authenticated: set[socket.socket] = set()
        self._streams: set[socket.socket] = set()
        self._spoke: set[socket.socket] = set()   # unauthenticated ones that have sent a byte
        #: connections admitted / shut down unauthenticated to make room / at their deadline /
        #: answered busy, so far
        self.admitted = self.turned_away = self.timed_out = self.busy = 0
        super().__init__(address, handler)

    @property
    def live_connections(self) -> int:
        """Connections being served now, authenticated or not."""
        with self._lock:
            return len(self._due) + len(self._authenticated)

    @property
    def unauthenticated_connections(self) -> int:
        with self._lock:
            return len(self._due)

    def process_request(self, request, client_address) -> None:
        with self._lock:
            oldest = self._make_room() if len(self._due) >= self.max_unauthenticated else None
            if oldest is not None:
                del self._due[oldest]
                self._spoke.discard(oldest)
                self.turned_away += 1
            self._due[request] = time.monotonic() + self.hello_timeout_s
            self.admitted += 1
        if oldest is not None:
            log.debug("%s: %d unauthenticated connections already; shut the oldest", self.server_address,
                      self.max_unauthenticated)
            _shut(oldest)  # its thread ends on the closed socket and forgets it
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def _make_room(self) -> socket.socket:
        """The unauthenticated connection to shut for a newcomer (called under the lock): the
        oldest that has not spoken (no byte taken, none waiting), else the oldest."""
        for sock in self._due:
            if sock not in self._spoke and not _has_bytes(sock):
                return sock
        return next(iter(self._due))

    def spoke(self, request) -> None:
        """`request` sent its first byte (the handler saw it before reading it)."""
        with self._lock:
            if request in self._due:
                self._spoke.add(request)

    def process_request_thread(self, request, client_address) -> None:
        request.settimeout(self.io_timeout_s)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request) -> None:
        with self._lock:
            self._due.pop(request, None)
            self._spoke.discard(request)
            self._authenticated.discard(request)
            self._streams.discard(request)

    def authenticated(self, request) -> bool:
        """Move `request` to the authenticated connections; False when they are full (or it
        was shut down meanwhile), and it must be answered busy."""
        with self._lock:
            self._spoke.discard(request)
            if self._due.pop(request, None) is None:
                return False
            if len(self._authenticated) >= self.max_connections:
                self.busy += 1
                return False
            self._authenticated.add(request)
            return True

    def streaming(self, request, on: bool) -> None:
        with self._lock:
            (self._streams.add if on else self._streams.discard)(request)

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._lock:
            overdue = [s for s, due in self._due.items() if now > due]
            for s in overdue:
                del self._due[s]  # shut down once; its thread ends on the closed socket
                self._spoke.discard(s)
            self.timed_out += len(overdue)
        for s in overdue:
            _shut(s)

    def cut_streams(self) -> int:
        """Shut down every connection marked streaming; how many there were."""
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            _shut(s)
        return len(streams)


def _has_bytes(sock: socket.socket) -> bool:
    """Whether `sock` is readable now (bytes wait, or it closed), without reading or blocking."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
    except (OSError, ValueError):
        return True  # closed already: its thread ends anyway
    return bool(poller.poll(0))


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already
