"""What peers say before data flows: the connection hello and the per-operation header.

Hello, once per connection, both sides authenticated with the job's key (see auth.py):

    acceptor -> dialler   challenge: a fresh nonce
    dialler  -> acceptor  hello: group id, generation, the dialler's address, the address it
                          meant to reach, its own fresh nonce, and a tag of all of these with the
                          acceptor's nonce (so a recorded hello never passes again)
    acceptor -> dialler   answer: ok or a refusal with its reason, tagged with the dialler's
                          nonce (so a stranger at the address cannot accept or refuse for a peer)

`judge_hello` and `judge_answer` are the two decisions (pure). A hello whose tag does not
verify is refused before anything else is looked at; a peer from an older generation is
refused, so a stale process can never join the current ring. Without a key (an endpoint
explicitly allowed to run unauthenticated) tags are empty and not checked.

Operation header (once per all-reduce, passed around the whole ring so every rank sees every
rank's header): sequence number, element count, dtype, op. `disagreement` names the first
difference; every rank sees the same N headers and so every rank raises the same FatalError.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from . import auth
from .transport import Connection

_LEN = struct.Struct("!I")
MAX_MESSAGE_BYTES = 64 << 10
#: a challenge, a hello or an answer is far smaller than this
MAX_HELLO_BYTES = 4 << 10
MAX_REASON_CHARS = 500


def send_message(conn: Connection, message: dict, timeout_s: float) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    conn.send_all(_LEN.pack(len(body)) + body, timeout_s)


def read_message(conn: Connection, timeout_s: float, limit: int = MAX_MESSAGE_BYTES) -> dict:
    head = bytearray(_LEN.size)
    conn.recv_exact(memoryview(head), timeout_s)
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise ValueError(f"handshake message of {n} bytes is larger than {limit}")
    body = bytearray(n)
    conn.recv_exact(memoryview(body), timeout_s)
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError(f"handshake message must be an object, got {_clip(repr(message))}")
    return message


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def challenge(nonce: bytes) -> dict:
    return {"kind": "challenge", "nonce": nonce.hex()}


def challenge_nonce(message: dict) -> bytes:
    """The acceptor's nonce from its challenge; ValueError when it is not one."""
    nonce = _nonce(message.get("nonce")) if message.get("kind") == "challenge" else None
    if nonce is None:
        raise ValueError(f"expected a challenge, got {_clip(repr(message))}")
    return nonce


def _nonce(value: object) -> bytes | None:
    if not isinstance(value, str) or len(value) != 2 * auth.NONCE_BYTES:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def hello(key: bytes | None, group_id: str, generation: int, sender: str, target: str, acceptor_nonce: bytes,
          own_nonce: bytes) -> dict:
    mac = auth.tag(key, "ftar hello", group_id, generation, sender, target, acceptor_nonce, own_nonce) if key else b""
    return {"kind": "hello", "group": group_id, "generation": generation, "from": sender, "to": target,
            "nonce": own_nonce.hex(), "mac": mac.hex()}


@dataclass(frozen=True)
class HelloVerdict:
    accept: bool
    reason: str
    fatal: bool = False  # a refusal that retrying cannot fix (wrong group, another job's key)


def judge_hello(message: dict, group_id: str | None, generation: int | None, key: bytes | None = None,
                acceptor_nonce: bytes = b"") -> HelloVerdict:
    """Accept a dialler as a possible left neighbour, or refuse it with a reason.

    group_id / generation: what this endpoint serves now (None before its first configure).
    key / acceptor_nonce: the job's key (None: unauthenticated) and the challenge this
    connection was sent.
    """
    # A malformed hello is a bug or a stranger: refuse.
    fields = (message.get("group"), message.get("generation"), message.get("from"), message.get("to"))
    if message.get("kind") != "hello" or not isinstance(fields[1], int) or isinstance(fields[1], bool) \
            or not all(isinstance(f, str) for f in (fields[0], fields[2], fields[3])) \
            or _nonce(message.get("nonce")) is None or not isinstance(message.get("mac"), str):
        return HelloVerdict(False, f"malformed hello {_clip(repr(message))}", fatal=True)
    # Not tagged with this job's key over this connection's challenge: a stranger, another job,
    # or a recorded hello played again. Nothing it claims is looked at.
    if key is not None:
        try:
            claimed = bytes.fromhex(message["mac"])
        except ValueError:
            claimed = b""
        if not auth.verify(key, claimed, "ftar hello", *fields, acceptor_nonce, _nonce(message["nonce"])):
            return HelloVerdict(False, "hello not authenticated: its tag does not match this connection's "
                                       "challenge under the job's key (another job's secret, a replayed hello, "
                                       "or a stranger)", fatal=True)
    # Another job or rank dialled the wrong port.
    if group_id is not None and message["group"] != group_id:
        return HelloVerdict(False, f"this endpoint serves group {_clip(group_id)!r}, "
                                   f"not {_clip(message['group'])!r}", fatal=True)
    # A peer of an older membership: refuse so it cannot disturb the current ring.
    if generation is not None and message["generation"] < generation:
        return HelloVerdict(False, f"generation {message['generation']} is stale; "
                                   f"this endpoint is at generation {generation}")
    # Same or newer generation: keep it until configure() for that generation claims it.
    return HelloVerdict(True, "accepted")


def _answer_fields(message: dict, verdict_ok: bool, reason: str, fatal: bool) -> tuple:
    return int(verdict_ok), reason, int(fatal), str(message.get("group")), str(message.get("generation")), \
        str(message.get("from")), str(message.get("to"))


def answer(key: bytes | None, verdict: HelloVerdict, message: dict) -> dict:
    """The acceptor's answer to `message`, tagged with the dialler's nonce."""
    reason = _clip(verdict.reason)
    dialler_nonce = _nonce(message.get("nonce")) or b""
    mac = auth.tag(key, "ftar answer", *_answer_fields(message, verdict.accept, reason, verdict.fatal),
                   dialler_nonce) if key and dialler_nonce else b""
    return {"ok": verdict.accept, "reason": reason, "fatal": verdict.fatal, "mac": mac.hex()}


def judge_answer(key: bytes | None, reply: dict, sent: dict, own_nonce: bytes) -> HelloVerdict:
    """What the dialler makes of the acceptor's `reply` to the hello it `sent`."""
    ok, reason, fatal, mac = reply.get("ok"), reply.get("reason"), reply.get("fatal"), reply.get("mac")
    if not isinstance(ok, bool) or not isinstance(reason, str) or not isinstance(fatal, bool) \
            or not isinstance(mac, str):
        return HelloVerdict(False, f"malformed answer {_clip(repr(reply))}")
    if key is not None:
        try:
            claimed = bytes.fromhex(mac)
        except ValueError:
            claimed = b""
        if not auth.verify(key, claimed, "ftar answer", *_answer_fields(sent, ok, reason, fatal), own_nonce):
            # Whoever answered does not hold the job's key: not our peer. Its word counts for
            # nothing, a refusal included (a stranger must not make a healthy rank give up).
            return HelloVerdict(False, "the answer is not authenticated (whoever listens there does not hold "
                                       "the job's key)")
    return HelloVerdict(ok, _clip(reason), fatal and not ok)


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
