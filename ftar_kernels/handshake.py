"""What peers say before data flows: the connection hello and the per-operation header.

Hello (dialler -> acceptor, once per connection): group id, generation, the dialler's address and
the address it meant to reach. The acceptor answers at once with ok or a refusal and its reason;
`judge_hello` is that decision (pure). A peer from an older generation is refused, so a stale
process can never join the current ring.

Operation header (once per all-reduce, passed around the whole ring so every rank sees every
rank's header): sequence number, element count, dtype, op. `disagreement` names the first
difference; every rank sees the same N headers and so every rank raises the same FatalError.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from .transport import Connection

_LEN = struct.Struct("!I")
MAX_MESSAGE_BYTES = 64 << 10


def send_message(conn: Connection, message: dict, timeout_s: float) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    conn.send_all(_LEN.pack(len(body)) + body, timeout_s)


def read_message(conn: Connection, timeout_s: float) -> dict:
    head = bytearray(_LEN.size)
    conn.recv_exact(memoryview(head), timeout_s)
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE_BYTES:
        raise ValueError(f"handshake message of {n} bytes is larger than {MAX_MESSAGE_BYTES}")
    body = bytearray(n)
    conn.recv_exact(memoryview(body), timeout_s)
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError(f"handshake message must be an object, got {message!r}")
    return message


def hello(group_id: str, generation: int, sender: str, target: str) -> dict:
    return {"kind": "hello", "group": group_id, "generation": generation,
            "from": sender, "to": target}


@dataclass(frozen=True)
class HelloVerdict:
    accept: bool
    reason: str
    fatal: bool = False  # a refusal that retrying cannot fix (wrong group)


def judge_hello(message: dict, group_id: str | None, generation: int | None) -> HelloVerdict:
    """Accept a dialler as a possible left neighbour, or refuse it with a reason.

    group_id / generation: what this endpoint serves now (None before its first configure).
    """
    # A malformed hello is a bug or a stranger: refuse.
    if message.get("kind") != "hello" or not isinstance(message.get("generation"), int):
        return HelloVerdict(False, f"malformed hello {message!r}", fatal=True)
    # Another job or rank dialled the wrong port.
    if group_id is not None and message.get("group") != group_id:
        return HelloVerdict(False, f"this endpoint serves group {group_id!r}, "
                                   f"not {message.get('group')!r}", fatal=True)
    # A peer of an older membership: refuse so it cannot disturb the current ring.
    if generation is not None and message["generation"] < generation:
        return HelloVerdict(False, f"generation {message['generation']} is stale; "
                                   f"this endpoint is at generation {generation}")
    # Same or newer generation: keep it until configure() for that generation claims it.
    return HelloVerdict(True, "accepted")


DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
OP_SUM = 0
_HEADER = struct.Struct("!QQQII")


@dataclass(frozen=True)
class OpHeader:
    generation: int
    sequence: int
    numel: int
    dtype_code: int
    op_code: int = OP_SUM

    def pack(self) -> bytes:
        return _HEADER.pack(self.generation, self.sequence, self.numel, self.dtype_code, self.op_code)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> "OpHeader":
        return cls(*_HEADER.unpack(bytes(data)))


HEADER_BYTES = _HEADER.size
_NAMES = {v: k for k, v in DTYPE_CODES.items()}


def disagreement(headers: list[OpHeader]) -> str | None:
    """None when every rank asked for the same operation, else one sentence saying how not."""
    first = headers[0]
    for rank, h in enumerate(headers):
        if h == first:
            continue
        return (f"ranks disagree on the all-reduce: ring position 0 asked for "
                f"{first.numel} x {_NAMES.get(first.dtype_code, first.dtype_code)} "
                f"(op {first.op_code}, sequence {first.sequence}, generation {first.generation}) but "
                f"position {rank} asked for {h.numel} x {_NAMES.get(h.dtype_code, h.dtype_code)} "
                f"(op {h.op_code}, sequence {h.sequence}, generation {h.generation})")
    return None
