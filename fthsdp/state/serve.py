"""Serves this rank's live state over HTTP from CPU memory, for behind replicas.

GET  /state?step=N&replica=R[&lane=I&lanes=L]
                              streams the state (layout in fthsdp/state/stream.py), or lane I
                              of L of it (L connections at once), while this rank serves
                              step N; 409 otherwise.
POST /ack?step=N&replica=R    a fetcher verified its copy of step N.

Every request is signed with the job secret (fthsdp/state/request_auth.py) and refused
(401) otherwise, before anything else is looked at. Once the plan named this rank's
fetchers for the step (`serve(step, fetchers)`), only they may fetch (403 for any other
replica), and an ack counts only from a fetcher that was sent the whole stream (every lane
of it). Each stream is written from the tensors' memory by the connection's thread, on a
blocking socket bounded by a kernel send timeout (fthsdp/state/wire.py). Connections
are bounded (fthsdp/state/guarded_http.py): MAX_CONNECTIONS authenticated at once, and
apart from them MAX_UNAUTHENTICATED not yet authenticated, each shut down after
hello_timeout_s (at most MAX_HELLO_S) or when a newer connection needs its place, so
strangers' connections never take a fetcher's; io_timeout_s per socket read or write, one
request each.

Two calls drive it, each the execution of one protocol effect (fthsdp/step/protocol.py):
`serve(step)` -- the state now is the state at the start of `step`, and stays so until
`stop` -- and `stop(wait_for, timeout_s)`, called before the state changes: it waits
(bounded) until every replica in `wait_for` acknowledged its copy, then refuses new
fetches and cuts off any still running (that fetcher sees a short stream and votes no): a
transfer still writing CUT_OFF_GRACE_S later -- its reader stopped reading -- has its
connection shut down, so `stop` returns within timeout_s + 2 * CUT_OFF_GRACE_S.
Given an immutable copy of the state (`stop(..., keep=snapshot)`, fthsdp/state/snapshot.py),
`stop` returns at once instead: the copy goes on being served for that step to the replicas
in `wait_for` until each acknowledged it or timeout_s passed, while the rank trains on (the
same rules hold for it: only those fetchers, an ack only after the whole stream).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import parse_qs, urlparse

import torch

from fthsdp.state import request_auth, wire
from fthsdp.state.guarded_http import GuardedHTTPServer
from fthsdp.state.stream import MAX_LANES, Manifest, StreamTag, lane_runs, tensor_bytes

log = logging.getLogger(__name__)

MAX_REPLICA_CHARS = 128
MAX_ACKS = 4096
#: authenticated connections served at once (fetchers of one rank are a few replicas; one
#: connection each)
MAX_CONNECTIONS = 16
#: connections not authenticated yet, held apart; when full, a newcomer shuts the oldest idle one
MAX_UNAUTHENTICATED = 8
#: the longest a connection may take to authenticate (a fetcher sends its signed request at once)
MAX_HELLO_S = 2.0
#: after the hold: how long running transfers get to notice the cut-off, and again after
#: their connections were shut down
CUT_OFF_GRACE_S = 1.0
#: how long an ack waits for the plan's fetchers, or for its own transfer's last write
ACK_WAIT_S = 2.0

# What the server serves: a manifest and the live tensors in manifest order.
Snapshot = tuple[Manifest, list[torch.Tensor]]


class StateServer:
    """`key`: the state key of the job secret; None serves without authentication (only when
    the caller was told to run the trainer ports that way). `hello_timeout_s` is capped at
    MAX_HELLO_S (a trainer's hello timeout is also the coordinator's, which may be longer)."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], Snapshot], label: str = "", *,
                 key: bytes | None, hello_timeout_s: float = 10.0, io_timeout_s: float = 10.0) -> None:
        self._snapshot = snapshot
        self._label = label
        self._key = key
        self._seen = request_auth.SeenNonces()
        self._cond = threading.Condition()
        self._step = -1
        self._open = False
        self._active = 0
        self._cut_off = False
        self._fetchers: tuple[str, ...] | None = None
        self._acks: dict[int, set[str]] = {}
        self._sent = _Delivered()  # replicas sent the whole stream of the step served
        self._kept: _Kept | None = None
        #: fetch requests accepted (counted on acceptance, so a client that has its answer
        #: always sees its own request counted)
        self.fetches_accepted = 0
        self.refused_requests = 0
        self._httpd = _Server((host, port), _Handler, MAX_CONNECTIONS, MAX_UNAUTHENTICATED,
                              min(hello_timeout_s, MAX_HELLO_S), io_timeout_s)
        self._httpd.owner = self
        if key is None:
            log.warning("state server %s serves WITHOUT authentication (insecure trainer ports)", label)
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
            self._open, self._cut_off, self._kept = False, True, None
            self._cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def connections(self) -> int:
        """Connections being served now (each holds one thread)."""
        return self._httpd.live_connections

    def serve(self, step: int, fetchers: tuple[str, ...] | None = None) -> None:
        """The state now is the state at the start of `step` and does not change until `stop`.
        `fetchers`: the replicas the plan assigned to fetch it (None: not known yet)."""
        with self._cond:
            self._fetchers = None if fetchers is None else tuple(fetchers)
            if not (self._open and self._step == step):
                self._step, self._open, self._cut_off = step, True, False
                self._acks = {s: r for s, r in self._acks.items() if s >= step}
                self._sent = _Delivered()
            self._cond.notify_all()

    def stop(self, wait_for: tuple[str, ...] = (), timeout_s: float = 0.0, keep: Snapshot | None = None) -> set[str]:
        """Wait until every replica in `wait_for` acknowledged the step served (at most
        timeout_s), then stop serving. Returns the replicas that did not acknowledge in time.
        With `keep` (an immutable copy of the state served) nobody waits: see the module
        docstring; returns the replicas whose acknowledgement is still to come."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            step = self._step
            if keep is not None and self._open:
                # transfers running now read this same copy: they go on, their acks count
                missing = set(wait_for) - self._acks.get(step, set())
                if missing:
                    self._kept = _Kept(step, keep, missing, deadline, frozenset(missing), self._sent)
                self._open = False
                self._cond.notify_all()
                return missing
            while True:
                missing = set(wait_for) - self._acks.get(step, set())
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    break
                self._cond.wait(left)
            self._open = False
            if self._active:
                self._cut_off = True
                if not self._cond.wait_for(lambda: self._active == 0, timeout=CUT_OFF_GRACE_S):
                    cut = self._httpd.cut_streams()  # readers that stopped reading: their writes end now
                    log.warning("%s shut down %d stalled transfer(s) of step %s", self._label, cut, step)
                    self._cond.wait_for(lambda: self._active == 0, timeout=CUT_OFF_GRACE_S)
        if missing:
            log.warning("%s stopped waiting for fetchers %s of step %s after %.1fs",
                        self._label, sorted(missing), step, timeout_s)
        return missing

    # -- called by the handler threads

    def _authenticate(self, method: str, target: str, header: str | None) -> bytes:
        """The request's nonce; raise request_auth.Refused unless it is signed with the job secret."""
        if self._key is None:
            return b""
        with self._cond:
            try:
                return request_auth.check(self._key, method, target, header, time.time(), self._seen)
            except request_auth.Refused:
                self.refused_requests += 1
                raise

    def _begin(self, step: int, replica: str) -> tuple[HTTPStatus, str, _Admitted | None]:
        """Admit one fetch of `step` by `replica`: of the live state or of the kept copy."""
        with self._cond:
            kept = self._kept_now()
            if kept is not None and step == kept.step:
                if replica not in kept.fetchers:
                    return HTTPStatus.FORBIDDEN, _not_a_fetcher(replica, step, tuple(sorted(kept.fetchers))), None
                self.fetches_accepted += 1
                return HTTPStatus.OK, "", _Admitted(kept, kept.sent)
            if not self._open or step != self._step:
                return HTTPStatus.CONFLICT, f"not serving step {step} now", None
            if self._fetchers is not None and replica not in self._fetchers:
                return HTTPStatus.FORBIDDEN, _not_a_fetcher(replica, step, self._fetchers), None
            self._active += 1
            self.fetches_accepted += 1
            return HTTPStatus.OK, "", _Admitted(None, self._sent)

    def _end(self, admitted: _Admitted, replica: str, lane: int, lanes: int, complete: bool) -> None:
        with self._cond:
            if admitted.kept is None:
                self._active -= 1
            if complete:
                admitted.sent.record(replica, lane, lanes)
            self._cond.notify_all()

    def _kept_now(self) -> _Kept | None:
        """The kept copy while it is still wanted (called under the lock)."""
        kept = self._kept
        if kept is not None and (not kept.missing or time.monotonic() >= kept.deadline):
            self._kept = kept = None
        return kept

    def _ack_decided(self, step: int, replica: str) -> bool:
        kept = self._kept_now()
        if kept is not None and step == kept.step:
            return replica not in kept.fetchers or replica in kept.sent
        return step != self._step or (self._fetchers is not None and (
            replica not in self._fetchers or replica in self._sent))

    def _ack(self, step: int, replica: str) -> tuple[HTTPStatus, str]:
        """Record one acknowledgement of the step served now: only from a fetcher the plan
        assigned, once it was sent the whole stream (waits ACK_WAIT_S at most for either)."""
        with self._cond:
            self._cond.wait_for(lambda: self._ack_decided(step, replica), timeout=ACK_WAIT_S)
            kept = self._kept_now()
            if kept is not None and step == kept.step:
                if replica not in kept.fetchers:
                    return HTTPStatus.FORBIDDEN, _not_a_fetcher(replica, step, tuple(sorted(kept.fetchers)))
                if replica not in kept.sent:
                    return HTTPStatus.CONFLICT, f"replica {replica} was not sent the whole state of step {step}"
                kept.missing.discard(replica)
                self._cond.notify_all()
                return HTTPStatus.OK, "ok"
            if step != self._step:
                return HTTPStatus.CONFLICT, f"not serving step {step} now"
            if self._fetchers is None or replica not in self._fetchers:
                return HTTPStatus.FORBIDDEN, _not_a_fetcher(replica, step, self._fetchers)
            if replica not in self._sent:
                return HTTPStatus.CONFLICT, f"replica {replica} was not sent the whole state of step {step}"
            self._acks.setdefault(step, set()).add(replica)
            self._cond.notify_all()
            return HTTPStatus.OK, "ok"

    def _stream(self, snapshot: Snapshot, sock: socket.socket, nonce: bytes, kept: _Kept | None = None,
                lane: int = 0, lanes: int = 1) -> None:
        """Write one lane of the transfer body (fthsdp/state/stream.py), tagged over the request's
        `nonce`, from the tensors' own memory: each part is sent, then digested while in cache."""
        manifest, tensors = snapshot
        head = manifest.to_bytes()
        tag = StreamTag(self._key, nonce)
        tag.update_bytes(head)
        sock.sendall(head + tag.value())
        for run in lane_runs([tensor_bytes(t) for t in tensors], lane, lanes):
            if self._cut_off if kept is None else self._kept is not kept:
                raise ConnectionAbortedError("state changed while it was being read")
            wire.send_all(sock, [part for _, part in run])
            tag.update_run(run)
        sock.sendall(tag.value())


@dataclass
class _Kept:
    """An immutable copy of a step's state, served on to the plan's fetchers still missing."""
    step: int
    snapshot: Snapshot
    missing: set[str]
    deadline: float
    fetchers: frozenset[str]
    sent: _Delivered = field(default_factory=lambda: _Delivered())  # replicas sent the whole stream of it


class _Delivered:
    """The fetchers that were sent the whole stream of one step's state: every lane of one
    transfer (a fetch with another lane count starts the count again). At most MAX_ACKS."""

    def __init__(self) -> None:
        self._lanes: dict[str, tuple[int, set[int]]] = {}

    def record(self, replica: str, lane: int, lanes: int) -> None:
        count, done = self._lanes.get(replica, (lanes, set()))
        if count != lanes:
            count, done = lanes, set()
        if replica in self._lanes or len(self._lanes) < MAX_ACKS:
            done.add(lane)
            self._lanes[replica] = (count, done)

    def __contains__(self, replica: object) -> bool:
        count, done = self._lanes.get(replica, (0, set()))  # type: ignore[arg-type]
        return count > 0 and len(done) == count


@dataclass
class _Admitted:
    """One admitted fetch: of the kept copy (or of the live state, kept None), and where a
    complete transfer is recorded (the set of the step it read)."""
    kept: _Kept | None
    sent: set[str]


def _not_a_fetcher(replica: str, step: int, fetchers: tuple[str, ...] | None) -> str:
    if fetchers is None:
        return f"replica {replica}: the fetchers of step {step} are not known yet"
    return f"replica {replica} is not a fetcher of step {step} (the plan names {list(fetchers)[:8]})"


class _Server(GuardedHTTPServer):
    owner: StateServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("state server: " + format, *args)

    def setup(self) -> None:
        super().setup()
        try:  # wait (bounded by the hello deadline) for the first byte, and say so before it is read
            if self.request.recv(1, socket.MSG_PEEK):
                self.server.spoke(self.request)
        except OSError:
            pass  # shut down or timed out: reading the request ends the handler

    def _query(self) -> tuple[str, int, str, int, int]:
        """(path, step, replica, lane, lanes); step -1 and replica "" when missing or out of
        bounds, lanes 0 when lane and lanes do not fit (no lanes named: lane 0 of 1)."""
        url = urlparse(self.path)
        q = parse_qs(url.query)
        replica = q.get("replica", [""])[0]
        replica = replica if len(replica) <= MAX_REPLICA_CHARS else ""
        try:
            step = int(q.get("step", ["-1"])[0])
        except ValueError:
            step = -1
        lane, lanes = q.get("lane", ["0"])[0], q.get("lanes", ["1"])[0]
        if not (lane.isdigit() and lanes.isdigit() and int(lane) < int(lanes) <= MAX_LANES):
            return url.path, step, replica, 0, 0
        return url.path, step, replica, int(lane), int(lanes)

    def _reply(self, status: HTTPStatus, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authentic(self, method: str) -> bytes | None:
        """The request's nonce when it is signed with the job secret; None (answered 401/503) when not."""
        self.close_connection = True  # one request per connection: each is authenticated alone
        try:
            nonce = self.server.owner._authenticate(method, self.path, self.headers.get(request_auth.HEADER))
        except request_auth.Refused as exc:
            log.info("state server: refused a %s from %s: %s", method, self.client_address[0], exc)
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE if exc.busy else HTTPStatus.UNAUTHORIZED, str(exc))
            return None
        if not self.server.authenticated(self.request):
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, f"{MAX_CONNECTIONS} authenticated connections are being "
                                                        f"served; try again later")
            return None
        return nonce

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if self._authentic("POST") is None:
            return
        path, step, replica, _, _ = self._query()
        if path != "/ack" or step < 0 or not replica:
            return self._reply(HTTPStatus.BAD_REQUEST, "expected /ack?step=N&replica=R")
        self._reply(*self.server.owner._ack(step, replica))

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        nonce = self._authentic("GET")
        if nonce is None:
            return
        path, step, replica, lane, lanes = self._query()
        owner = self.server.owner
        if path != "/state" or step < 0 or not replica or not lanes:
            return self._reply(HTTPStatus.BAD_REQUEST, f"expected /state?step=N&replica=R, optionally with "
                                                       f"&lane=I&lanes=L (I < L <= {MAX_LANES})")
        status, why, admitted = owner._begin(step, replica)
        if admitted is None:
            return self._reply(status, why)
        kept = admitted.kept
        complete = False
        self.server.streaming(self.request, True)
        try:
            # No Nagle: a run of small tensors (or the manifest) after data the fetcher has not
            # acknowledged yet would wait for its delayed ACK while the fetcher waits for it
            # (a 304-entry shard took 38-41 ms with it, 30-33 without; docs/architecture.md).
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                snapshot = kept.snapshot if kept is not None else owner._snapshot()
            except RuntimeError as exc:  # no state to serve now (snapshot.py): refused like any fetch
                return self._reply(HTTPStatus.CONFLICT, f"step {step}: {exc}")
            manifest = snapshot[0]
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(manifest.body_bytes(lane, lanes)))
            self.end_headers()
            self.wfile.flush()
            wire.use_kernel_timeouts(self.request, self.server.io_timeout_s)  # no poll() per send
            owner._stream(snapshot, self.request, nonce, kept, lane, lanes)
            complete = True
        except (ConnectionError, OSError) as exc:
            log.info("state transfer of step %s ended early: %s", step, exc)
        finally:
            self.server.streaming(self.request, False)
            owner._end(admitted, replica, lane, lanes, complete)
