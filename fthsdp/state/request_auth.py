"""Authenticating state-server requests (pure: the time comes in as `now`).

Every request carries one header, `X-Fthsdp-Auth: v1 TIME NONCE TAG`: its Unix time in
seconds, a fresh random nonce and a tag (ftar_kernels/auth.py) under the state key of the job
secret over the method, the path with its query (step and replica), the time and the nonce.
The server accepts a request only when the tag verifies, its time is within MAX_SKEW_S of the
server's clock, and its nonce was not seen in that window (`SeenNonces`): a recorded request
never passes again, and a stranger's never passes at all.
"""

from __future__ import annotations

import math

from ftar_kernels import auth

HEADER = "X-Fthsdp-Auth"
VERSION = "v1"
#: how far a request's time may be from the server's (hosts of one job keep NTP time)
MAX_SKEW_S = 120.0
#: nonces remembered at once: more requests than this inside one window are refused for now
MAX_NONCES = 4096
MAX_HEADER_CHARS = 256
_LABEL = "state request"


def sign(key: bytes, method: str, target: str, now: float, nonce: bytes) -> str:
    """The header value for one request to `target` (path and query, as sent)."""
    at = int(now)
    return f"{VERSION} {at} {nonce.hex()} {auth.tag(key, _LABEL, method, target, at, nonce).hex()}"


class Refused(ValueError):
    """A request that does not authenticate; `busy` when it may simply try again later."""

    def __init__(self, reason: str, busy: bool = False) -> None:
        super().__init__(reason)
        self.busy = busy


class SeenNonces:
    """The nonces of accepted requests, each kept until its request's time leaves the window."""

    def __init__(self, limit: int = MAX_NONCES) -> None:
        self.limit = limit
        self._until: dict[bytes, float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def add(self, nonce: bytes, until: float, now: float) -> None:
        """Keep `nonce` until `until`; Refused when it was seen, or too many are kept now."""
        if nonce in self._until:
            raise Refused("the request was replayed (its nonce was used before)")
        if len(self._until) >= self.limit:
            self._until = {n: t for n, t in self._until.items() if t >= now}
            if len(self._until) >= self.limit:
                raise Refused(f"more than {self.limit} requests arrived within {2 * MAX_SKEW_S:g}s; try again later",
                              busy=True)
        self._until[nonce] = until


def check(key: bytes, method: str, target: str, header: str | None, now: float, seen: SeenNonces) -> bytes:
    """The request's nonce (the server tags its answer over it: fthsdp/state/stream.py); raise
    Refused (saying why, never echoing the header at length) unless the request is authentic."""
    if not header:
        raise Refused(f"no {HEADER} header: every request must be signed with the job secret")
    if len(header) > MAX_HEADER_CHARS:
        raise Refused(f"the {HEADER} header is {len(header)} characters; the limit is {MAX_HEADER_CHARS}")
    parts = header.split(" ")
    if len(parts) != 4 or parts[0] != VERSION or not parts[1].isdigit():
        raise Refused(f"the {HEADER} header is not '{VERSION} TIME NONCE TAG'")
    try:
        at, nonce, claimed = int(parts[1]), bytes.fromhex(parts[2]), bytes.fromhex(parts[3])
    except ValueError:
        raise Refused(f"the {HEADER} header's nonce and tag must be hex") from None
    if len(nonce) != auth.NONCE_BYTES:
        raise Refused(f"the request's nonce is {len(nonce)} bytes; it must be {auth.NONCE_BYTES}")
    if not math.isfinite(now) or abs(now - at) > MAX_SKEW_S:
        raise Refused(f"the request's time is {now - at:+.0f}s away from this host's clock (the limit is "
                      f"{MAX_SKEW_S:g}s): check the hosts' clocks")
    if not auth.verify(key, claimed, _LABEL, method, target, at, nonce):
        raise Refused("the request is not authenticated: its tag does not match under the job secret (a "
                      "stranger, or another job's secret)")
    seen.add(nonce, at + MAX_SKEW_S, now)
    return nonce
