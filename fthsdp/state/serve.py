"""Serves this rank's live state over HTTP from CPU memory, for behind replicas.

GET  /state?step=N&replica=R  streams the state (layout in fthsdp/state/stream.py) while
                              this rank serves step N; 409 otherwise.
POST /ack?step=N&replica=R    a fetcher verified its copy of step N.

Two calls drive it, each the execution of one protocol effect (fthsdp/step/protocol.py):
`serve(step)` -- the state now is the state at the start of `step`, and stays so until
`stop` -- and `stop(wait_for, timeout_s)`, called before the state changes: it waits
(bounded) until every replica in `wait_for` acknowledged its copy, then refuses new
fetches and cuts off any still running (that fetcher sees a short stream and votes no).
"""

from __future__ import annotations

import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlparse

import torch

from fthsdp.state.stream import PIECE_BYTES, TRAILER, Manifest, PipelinedChecksum, tensor_bytes

log = logging.getLogger(__name__)

MAX_REPLICA_CHARS = 128
MAX_ACKS = 4096

# What the server serves: a manifest and the live tensors in manifest order.
Snapshot = tuple[Manifest, list[torch.Tensor]]


class StateServer:
    def __init__(self, host: str, port: int, snapshot: Callable[[], Snapshot], label: str = "") -> None:
        self._snapshot = snapshot
        self._label = label
        self._cond = threading.Condition()
        self._step = -1
        self._open = False
        self._active = 0
        self._cut_off = False
        self._acks: dict[int, set[str]] = {}
        #: fetch requests accepted (counted on acceptance, so a client that has its answer
        #: always sees its own request counted)
        self.fetches_accepted = 0
        self._httpd = _Server((host, port), _Handler)
        self._httpd.owner = self
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> "StateServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"state-server{self._label}",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cond:
            self._open, self._cut_off = False, True
            self._cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    def serve(self, step: int) -> None:
        """The state now is the state at the start of `step` and does not change until `stop`."""
        with self._cond:
            if self._open and self._step == step:
                return
            self._step, self._open, self._cut_off = step, True, False
            self._acks = {s: r for s, r in self._acks.items() if s >= step}
            self._cond.notify_all()

    def stop(self, wait_for: tuple[str, ...] = (), timeout_s: float = 0.0) -> set[str]:
        """Wait until every replica in `wait_for` acknowledged the step served (at most
        timeout_s), then stop serving. Returns the replicas that did not acknowledge in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            step = self._step
            while True:
                missing = set(wait_for) - self._acks.get(step, set())
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    break
                self._cond.wait(left)
            self._open = False
            if self._active:
                self._cut_off = True
                self._cond.wait_for(lambda: self._active == 0, timeout=max(1.0, timeout_s))
        if missing:
            log.warning("%s stopped waiting for fetchers %s of step %s after %.1fs",
                        self._label, sorted(missing), step, timeout_s)
        return missing

    # -- called by the handler threads

    def _begin(self, step: int) -> bool:
        with self._cond:
            if not self._open or step != self._step:
                return False
            self._active += 1
            self.fetches_accepted += 1
            return True

    def _end(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def _ack(self, step: int, replica: str) -> bool:
        """Record one acknowledgement of the step served now (bounded: it may come from anyone)."""
        with self._cond:
            if step != self._step or len(replica) > MAX_REPLICA_CHARS or len(self._acks.get(step, ())) >= MAX_ACKS:
                return False
            self._acks.setdefault(step, set()).add(replica)
            self._cond.notify_all()
            return True

    def _stream(self, snapshot: Snapshot, write: Callable[[bytes | memoryview], object]) -> None:
        manifest, tensors = snapshot
        head = manifest.to_bytes()
        with PipelinedChecksum() as checksum:
            checksum.update_bytes(head)
            write(head)
            for t in tensors:
                view = tensor_bytes(t)
                for off in range(0, len(view), PIECE_BYTES):
                    if self._cut_off:
                        raise ConnectionAbortedError("state changed while it was being read")
                    piece = view[off:off + PIECE_BYTES]
                    checksum.update_piece(piece)
                    write(piece)
            write(TRAILER.pack(checksum.value()))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: StateServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("state server: " + format, *args)

    def _query(self) -> tuple[str, int, str]:
        url = urlparse(self.path)
        q = parse_qs(url.query)
        try:
            return url.path, int(q.get("step", ["-1"])[0]), q.get("replica", [""])[0]
        except ValueError:
            return url.path, -1, ""

    def _reply(self, status: HTTPStatus, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path, step, replica = self._query()
        if path != "/ack" or step < 0 or not replica:
            return self._reply(HTTPStatus.BAD_REQUEST, "expected /ack?step=N&replica=R")
        if not self.server.owner._ack(step, replica):
            return self._reply(HTTPStatus.CONFLICT, f"not serving step {step} now")
        self._reply(HTTPStatus.OK, "ok")

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path, step, _ = self._query()
        owner = self.server.owner
        if path != "/state" or step < 0:
            return self._reply(HTTPStatus.BAD_REQUEST, "expected /state?step=N&replica=R")
        if not owner._begin(step):
            return self._reply(HTTPStatus.CONFLICT, f"not serving step {step} now")
        try:
            snapshot = owner._snapshot()
            manifest = snapshot[0]
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(manifest.total_bytes))
            self.end_headers()
            owner._stream(snapshot, self.wfile.write)
        except (ConnectionError, OSError) as exc:
            log.info("state transfer of step %s ended early: %s", step, exc)
            self.close_connection = True
        finally:
            owner._end()
