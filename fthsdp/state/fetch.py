"""Fetches a peer's live state over HTTP straight into this rank's tensors.

The body is received into its destination tensors as it arrives, straight from the socket
(fthsdp/state/wire.py: no buffered copy, never the whole body held).
Its manifest tag is checked before the manifest is parsed and before one byte of state is
written, its stream tag before the fetch is acknowledged to the source and handed back,
staged (`Fetched`), for the Manager to load: both are MACs under the state key over this
request's nonce (see fthsdp/state/stream.py), so only a source that holds the job secret
can answer, and only this request.
A short, damaged or refused transfer raises TransferError; `fetch_state` tries again up
to `attempts` times. Every request is signed with the state key of the job secret
(fthsdp/state/request_auth.py; `key` None: the source serves without authentication).
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
import threading
import time
from typing import Callable

from ftar_kernels import auth
from fthsdp.state import request_auth, wire
from fthsdp.state.stream import (HEADER, MAX_MANIFEST_BYTES, PART_BYTES, STREAM_FORMAT, TAG_BYTES, Fetched,
                                 Manifest, StateTarget, StreamTag, TransferError, lane_runs, tags_match)

log = logging.getLogger(__name__)


def _signed(key: bytes | None, method: str, target: str, nonce: bytes) -> dict[str, str]:
    return {request_auth.HEADER: request_auth.sign(key, method, target, time.time(), nonce)} if key else {}


def _unauthentic(address: str, what: str) -> TransferError:
    return TransferError(f"the state {what} from {address} does not verify under the job secret: damaged in "
                         f"transit (its checksum tag differs), or its source does not hold the job secret "
                         f"(or speaks another stream format than this fetcher's {STREAM_FORMAT!r})")


#: a fetch opens one lane (connection) per LANE_MIN_BYTES of the state it expects, at most
#: FETCH_LANES and one per CPUS_PER_LANE of this host's CPUs: a lane's threads keep about a core
#: busy at each end, so on a small host one lane already takes every core (measured on 2 cores:
#: a second lane gained nothing for one fetch and lost when two ranks fetched at once;
#: docs/architecture.md, "The data plane")
FETCH_LANES = 2
LANE_MIN_BYTES = 16 << 20
CPUS_PER_LANE = 4


def lanes_for(expected_bytes: int, cpus: int | None = None) -> int:
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    return max(1, min(FETCH_LANES, expected_bytes // LANE_MIN_BYTES, cpus // CPUS_PER_LANE))


class _Lane:
    """One connection of a fetch: its signed request (sent at construction), its authenticated
    manifest, then its share of the tensor bytes received straight into their destinations and
    its stream tag checked. `close()` in any case."""

    def __init__(self, address: str, step: int, replica_id: str, lane: int, lanes: int, timeout_s: float,
                 key: bytes | None) -> None:
        self.address, self.lane, self.lanes, self._timeout_s = address, lane, lanes, timeout_s
        path = f"/state?step={step}&replica={replica_id}" + (f"&lane={lane}&lanes={lanes}" if lanes > 1 else "")
        nonce = auth.nonce() if key else b""
        self.tag = StreamTag(key, nonce)
        self.resp: wire.Response | None = None
        try:
            self._sock = wire.send_get(address, path, _signed(key, "GET", path, nonce), timeout_s)
        except OSError as exc:
            raise TransferError(f"state fetch from {address} failed: {exc!r}") from exc

    def manifest(self, step: int) -> bytes:
        """The manifest's bytes, once its tag verified (before anything parses them)."""
        try:
            self.resp = resp = wire.read_response(self._sock, self.address, self._timeout_s, PART_BYTES)
        except OSError as exc:
            raise TransferError(f"state fetch from {self.address} failed: {exc!r}") from exc
        if resp.status != 200:
            raise TransferError(f"{self.address} refused step {step}: {resp.status} {resp.read_some(200)!r}")
        head = bytearray(HEADER.size)
        resp.read_exact(memoryview(head))
        (length,) = HEADER.unpack(head)
        if length > MAX_MANIFEST_BYTES:
            raise TransferError(f"state manifest claims {length} bytes, more than {MAX_MANIFEST_BYTES}")
        body = bytearray(length + TAG_BYTES)
        resp.read_exact(memoryview(body))
        self.tag.update_bytes(head)
        self.tag.update_bytes(body[:length])
        if not tags_match(body[length:], self.tag.value()):
            raise _unauthentic(self.address, "manifest")
        return bytes(body[:length])

    def abort(self) -> None:
        """Wake this lane's read blocked in another thread (it then fails)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self._sock.close()

    def receive(self, views: list[memoryview], stop: Callable[[], bool]) -> None:
        """This lane's parts, each straight into its destination (a run of small ones at once,
        `lane_runs`) and digested while in cache."""
        resp = self.resp
        assert resp is not None, "manifest() first"
        for run in lane_runs(views, self.lane, self.lanes):
            if stop():
                raise TransferError(f"fetch from {self.address} was cancelled")
            resp.read_into([part for _, part in run])
            self.tag.update_run(run)
        trailer = bytearray(TAG_BYTES)
        resp.read_exact(memoryview(trailer))
        if not tags_match(trailer, self.tag.value()):
            raise _unauthentic(self.address, "stream")


def fetch_once(address: str, step: int, replica_id: str, target_of: Callable[[], StateTarget],
               timeout_s: float, cancelled: Callable[[], bool] = lambda: False, *, key: bytes | None,
               lanes: int | None = None) -> Fetched:
    """One attempt: GET the state of `step` from `address` into a fresh target, over `lanes`
    connections at once (default: by the state's size, `lanes_for`); verify; stage.
    `cancelled()` is checked between parts; when it turns true the fetch stops, loading nothing."""
    target = target_of()
    count = lanes or lanes_for(target.expected_bytes)
    opened: list[_Lane] = []
    try:
        for i in range(count):
            opened.append(_Lane(address, step, replica_id, i, count, timeout_s, key))
        target.prepare()  # while the source answers
        manifests = [lane.manifest(step) for lane in opened]  # each under its own request's nonce
        if any(m != manifests[0] for m in manifests[1:]):
            raise TransferError(f"{address} sent {count} lanes of step {step} with different manifests")
        manifest = Manifest.from_json(manifests[0])
        if manifest.step != step:
            raise TransferError(f"{address} sent step {manifest.step}, asked for {step}")
        target.check(manifest)  # every entry fits this rank, before one byte of state is written
        views = [target.view(entry) for entry in manifest.entries]
        _receive_lanes(opened, views, cancelled, timeout_s)
        return target.finish(manifest)
    finally:
        for lane in opened:
            lane.close()


def _receive_lanes(lanes: list[_Lane], views: list[memoryview], cancelled: Callable[[], bool],
                   timeout_s: float) -> None:
    """Lane 0 on this thread, the others on their own; the first failure stops them all (their
    sockets are shut down, which wakes a blocked read) and is raised once all have ended."""
    errors: list[TransferError] = []
    failed = threading.Event()

    def run(lane: _Lane) -> None:
        try:
            lane.receive(views, lambda: failed.is_set() or cancelled())
        except Exception as exc:  # noqa: BLE001 - any failure of a lane fails the fetch, never a silent gap
            errors.append(exc if isinstance(exc, TransferError) else
                          TransferError(f"fetch lane {lane.lane} from {lane.address} failed: {exc!r}"))
            failed.set()
            for other in lanes:
                other.abort()

    helpers = [threading.Thread(target=run, args=(lane,), name=f"state-fetch-lane{lane.lane}", daemon=True)
               for lane in lanes[1:]]
    for t in helpers:
        t.start()
    run(lanes[0])
    for t in helpers:
        t.join(timeout_s + 5.0)  # each read is bounded by timeout_s, and a failure shuts them down
    if any(t.is_alive() for t in helpers):
        errors.append(TransferError("a fetch lane did not stop within its timeout"))
    if errors:
        raise errors[0]


def acknowledge(address: str, step: int, replica_id: str, timeout_s: float, *, key: bytes | None) -> None:
    """Tell the source this replica holds step `step`; the source may move on. Best effort."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        path = f"/ack?step={step}&replica={replica_id}"
        conn.request("POST", path, headers=_signed(key, "POST", path, auth.nonce()))
        resp = conn.getresponse()
        answer = resp.read(1000)
        if resp.status != 200:
            log.warning("%s did not take the ack of step %s: %s %r", address, step, resp.status, answer)
    except (OSError, http.client.HTTPException) as exc:
        log.info("could not acknowledge step %s to %s: %s", step, address, exc)
    finally:
        conn.close()


def fetch_state(address: str, step: int, replica_id: str, target_of: Callable[[], StateTarget],
                timeout_s: float, attempts: int, cancelled: Callable[[], bool] = lambda: False, *,
                key: bytes | None) -> Fetched:
    """Fetch with retries; acknowledges the source after a verified load."""
    last: TransferError | None = None
    for attempt in range(1, attempts + 1):
        if cancelled():
            break
        try:
            fetched = fetch_once(address, step, replica_id, target_of, timeout_s, cancelled, key=key)
            acknowledge(address, step, replica_id, timeout_s, key=key)
            return fetched
        except TransferError as exc:
            last = exc
            log.warning("replica %s: fetch %d/%d of step %s from %s failed: %s",
                        replica_id, attempt, attempts, step, address, exc)
    raise last or TransferError(f"fetch of step {step} from {address} was cancelled")
