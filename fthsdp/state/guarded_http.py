"""A threading HTTP server whose every connection is bounded: count, time to authenticate, I/O.

- At most `max_connections` connections are served at once (one thread each); one more is
  closed at once, unanswered, so a flood costs no thread.
- A connection that has not authenticated (`authenticated(sock)`, called by the handler once
  its request passed) within `hello_timeout_s` of its arrival is shut down, however slowly its
  bytes trickle in: the server's loop looks every poll interval (`service_actions`).
- Every socket read and write is bounded by `io_timeout_s`, so a peer that stops reading
  fails the write blocked on it.
- `cut_off(sock)`-marked streams can be shut down at once (`cut_streams`): a transfer whose
  reader stalls cannot keep the server from moving on.
"""

from __future__ import annotations

import logging
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

    def __init__(self, address: tuple[str, int], handler, max_connections: int, hello_timeout_s: float,
                 io_timeout_s: float) -> None:
        self.max_connections, self.hello_timeout_s, self.io_timeout_s = max_connections, hello_timeout_s, io_timeout_s
        self._lock = threading.Lock()
        self._due: dict[socket.socket, float] = {}   # live connection -> when it must have authenticated
        self._streams: set[socket.socket] = set()
        self.admitted = self.turned_away = 0  # connections served / closed unanswered, so far
        super().__init__(address, handler)

    @property
    def live_connections(self) -> int:
        with self._lock:
            return len(self._due)

    def process_request(self, request, client_address) -> None:
        with self._lock:
            full = len(self._due) >= self.max_connections
            if not full:
                self._due[request] = time.monotonic() + self.hello_timeout_s
                self.admitted += 1
            else:
                self.turned_away += 1
        if full:
            log.info("%s: %d connections already; closed the one from %s", self.server_address, self.max_connections,
                     client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        request.settimeout(self.io_timeout_s)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request) -> None:
        with self._lock:
            self._due.pop(request, None)
            self._streams.discard(request)

    def authenticated(self, request) -> None:
        with self._lock:
            if request in self._due:
                self._due[request] = float("inf")

    def streaming(self, request, on: bool) -> None:
        with self._lock:
            (self._streams.add if on else self._streams.discard)(request)

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._lock:
            overdue = [s for s, due in self._due.items() if now > due]
            for s in overdue:
                self._due[s] = float("inf")  # shut down once
        for s in overdue:
            _shut(s)

    def cut_streams(self) -> int:
        """Shut down every connection marked streaming; how many there were."""
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            _shut(s)
        return len(streams)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already
