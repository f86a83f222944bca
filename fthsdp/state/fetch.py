"""Fetches a peer's live state over HTTP straight into this rank's tensors.

The body is streamed into its destination tensors as it arrives (never buffered whole).
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
import time
from typing import Callable

from ftar_kernels import auth
from fthsdp.state import request_auth
from fthsdp.state.stream import (HEADER, MAX_MANIFEST_BYTES, PIECE_BYTES, TAG_BYTES, Fetched, Manifest,
                                 PipelinedTag, StateTarget, TransferError, tags_match, tensor_bytes)

log = logging.getLogger(__name__)


def _read_exact(resp: http.client.HTTPResponse, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = resp.readinto(view[got:])
        if not n:
            raise TransferError(f"state stream ended after {got} of {len(view)} bytes of a section")
        got += n


def _signed(key: bytes | None, method: str, target: str, nonce: bytes) -> dict[str, str]:
    return {request_auth.HEADER: request_auth.sign(key, method, target, time.time(), nonce)} if key else {}


def _unauthentic(address: str, what: str) -> TransferError:
    return TransferError(f"the state {what} from {address} does not verify under the job secret: damaged in "
                         f"transit (its checksum tag differs), or its source does not hold the job secret")


def fetch_once(address: str, step: int, replica_id: str, target_of: Callable[[], StateTarget],
               timeout_s: float, cancelled: Callable[[], bool] = lambda: False, *, key: bytes | None) -> Fetched:
    """One attempt: GET the state of `step` from `address` into a fresh target; verify; stage.
    `cancelled()` is checked between pieces; when it turns true the fetch stops, loading nothing."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        path = f"/state?step={step}&replica={replica_id}"
        nonce = auth.nonce() if key else b""
        conn.request("GET", path, headers=_signed(key, "GET", path, nonce))
        resp = conn.getresponse()
        if resp.status != 200:
            raise TransferError(f"{address} refused step {step}: {resp.status} {resp.read(200)!r}")
        head = bytearray(HEADER.size)
        _read_exact(resp, memoryview(head))
        (length,) = HEADER.unpack(head)
        if length > MAX_MANIFEST_BYTES:
            raise TransferError(f"state manifest claims {length} bytes, more than {MAX_MANIFEST_BYTES}")
        body = bytearray(length + TAG_BYTES)
        _read_exact(resp, memoryview(body))
        with PipelinedTag(key, nonce) as checksum:
            checksum.update_bytes(head)
            checksum.update_bytes(body[:length])
            if not tags_match(body[length:], checksum.value()):  # before the manifest is even parsed
                raise _unauthentic(address, "manifest")
            manifest = Manifest.from_json(bytes(body[:length]))
            if manifest.step != step:
                raise TransferError(f"{address} sent step {manifest.step}, asked for {step}")
            target = target_of()
            target.check(manifest)  # every entry fits this rank, before one byte of state is written
            destinations = [tensor_bytes(target.destination(entry)) for entry in manifest.entries]
            for view in destinations:
                for off in range(0, len(view), PIECE_BYTES):
                    if cancelled():
                        raise TransferError(f"fetch of step {step} from {address} was cancelled")
                    piece = view[off:off + PIECE_BYTES]
                    _read_exact(resp, piece)
                    checksum.update_piece(piece)
            trailer = bytearray(TAG_BYTES)
            _read_exact(resp, memoryview(trailer))
            if not tags_match(trailer, checksum.value()):
                raise _unauthentic(address, "stream")
        return target.finish(manifest)
    except (OSError, http.client.HTTPException) as exc:
        raise TransferError(f"state fetch from {address} failed: {exc!r}") from exc
    finally:
        conn.close()


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
