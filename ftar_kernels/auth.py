"""Message tags: HMAC-SHA256 over a label and a list of fields, each length-prefixed.

The encoding is unambiguous (no two field lists give the same bytes), so a tag binds exactly
the fields it names: `tag(key, "hello", "g", 3)` never verifies for `("g3",)` or for another
label. Fields are str (UTF-8), int (signed, decimal) or bytes. The FTAR hello uses these; the
trainer runtime's other ports use them too (they may import FTAR; FTAR imports nothing of theirs).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

NONCE_BYTES = 32
TAG_BYTES = 32
_LEN = struct.Struct("!I")


def nonce() -> bytes:
    """A fresh random challenge."""
    return os.urandom(NONCE_BYTES)


def _encode(field: str | int | bytes) -> bytes:
    if isinstance(field, bool) or not isinstance(field, (str, int, bytes)):
        raise TypeError(f"a tagged field is str, int or bytes, got {type(field).__name__}")
    data = field if isinstance(field, bytes) else str(field).encode()
    kind = b"b" if isinstance(field, bytes) else b"i" if isinstance(field, int) else b"s"
    return kind + _LEN.pack(len(data)) + data


def tag(key: bytes, label: str, *fields: str | int | bytes) -> bytes:
    mac = hmac.new(key, _encode(label), hashlib.sha256)
    for field in fields:
        mac.update(_encode(field))
    return mac.digest()


def verify(key: bytes, claimed: bytes, label: str, *fields: str | int | bytes) -> bool:
    """Whether `claimed` is the tag of these fields (in constant time)."""
    return isinstance(claimed, bytes) and hmac.compare_digest(tag(key, label, *fields), claimed)
