"""The frames between a replica's ranks and its coordinator: protobuf (protos/replica.proto).

A frame is a 4-byte big-endian length and one serialized `RankFrame` or `CoordinatorFrame`.
Decoding checks everything before anything touches state: the length against its bound,
that the bytes parse, that exactly one message is set, and every field against its range
(ranks, steps, attempt numbers, string lengths, enum values). A `MessageError` names the
bad value; the receiver drops the connection that sent it.

The hello is a challenge/response under the coordinator key of the job secret: the
coordinator's challenge carries a fresh nonce; the rank's hello is tagged over every hello
field, that nonce and the rank's own fresh nonce (a recorded hello never passes again); the
coordinator's welcome is tagged over the rank's identity and both nonces (only the holder of
the secret can welcome a rank). Authentication belongs to the connection: frames after the
hello carry no tags.
"""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from ftar_kernels import auth
from protos import replica_pb2 as rpb

FRAME = struct.Struct(">I")
#: rank -> coordinator frames are small: a hello with two addresses is the largest
MAX_RANK_FRAME_BYTES = 16 << 10
#: the most a connection may send before it has authenticated (a hello is well under 1 KiB)
MAX_HELLO_FRAME_BYTES = 2 << 10
#: coordinator -> rank: a plan lists every member (and, when the quorum changed, its column
#: of their addresses)
MAX_COORDINATOR_FRAME_BYTES = 16 << 20
MAX_REASON_CHARS = 1000
MAX_ID_CHARS = 128
MAX_ADDRESS_CHARS = 256
MAX_AUTH_BYTES = 64
DIGEST_BYTES = 32
MAX_STEP = (1 << 62)


class MessageError(ValueError):
    """A frame that is malformed or out of bounds (the message names the bad value)."""


def frame(message: rpb.RankFrame | rpb.CoordinatorFrame) -> bytes:
    body = message.SerializeToString()
    return FRAME.pack(len(body)) + body


def clip(reason: str) -> str:
    """A reason cut to what a frame may carry."""
    return reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS - 3] + "..."


# ---------------------------------------------------------------- building frames


def hello(rank: int, world_size: int, job_id: str, replica_id: str, ftar_address: str, state_address: str,
          incarnation: str, replica_version: int = 0) -> rpb.RankFrame:
    return rpb.RankFrame(hello=rpb.RankHello(
        rank=rank, world_size=world_size, job_id=job_id, replica_id=replica_id, ftar_address=ftar_address,
        state_address=state_address, incarnation=incarnation, replica_version=replica_version))


def _hello_fields(h: rpb.RankHello) -> tuple:
    return (h.job_id, h.replica_id, h.rank, h.world_size, h.ftar_address, h.state_address, h.incarnation,
            h.nonce, h.replica_version)


def sign_hello(key: bytes | None, hello_frame: rpb.RankFrame, challenge_nonce: bytes) -> rpb.RankFrame:
    """`hello_frame` with a fresh nonce of the rank and its tag over the coordinator's challenge
    (no tag without a key)."""
    return signed_hello(key, hello_frame, "coordinator hello", _hello_fields, challenge_nonce)


def signed_hello(key: bytes | None, hello_frame: rpb.RankFrame, label: str, fields, challenge_nonce: bytes) -> rpb.RankFrame:
    """A copy of `hello_frame` (a rank's hello or a relay's) with a fresh nonce and the tag of
    `fields(hello)` under `label` over the challenge (no tag without a key)."""
    signed = rpb.RankFrame()
    signed.CopyFrom(hello_frame)
    h = getattr(signed, signed.WhichOneof("body"))
    h.nonce = auth.nonce()
    h.auth = auth.tag(key, label, *fields(h), challenge_nonce) if key else b""
    return signed


def hello_is_authentic(key: bytes, h: rpb.RankHello, challenge_nonce: bytes) -> bool:
    return len(h.nonce) == auth.NONCE_BYTES and auth.verify(key, h.auth, "coordinator hello", *_hello_fields(h),
                                                            challenge_nonce)


def welcome(key: bytes | None, h: rpb.RankHello, challenge_nonce: bytes, relay_address: str = "") -> rpb.CoordinatorFrame:
    """The answer to an authenticated hello; with `relay_address`, it sends the rank to its relay."""
    tag = auth.tag(key, "coordinator welcome", *_hello_fields(h), challenge_nonce, relay_address) if key else b""
    return rpb.CoordinatorFrame(welcome=rpb.Welcome(auth=tag, relay_address=relay_address))


def welcome_is_authentic(key: bytes, w: rpb.Welcome, h: rpb.RankHello, challenge_nonce: bytes) -> bool:
    return auth.verify(key, w.auth, "coordinator welcome", *_hello_fields(h), challenge_nonce, w.relay_address)


def begin(step: int) -> rpb.RankFrame:
    return rpb.RankFrame(begin=rpb.BeginStep(step=step))


def vote(attempt: int, ok: bool, reason: str, loss: float, tokens: int) -> rpb.RankFrame:
    return rpb.RankFrame(vote=rpb.StepVote(attempt=attempt, ok=ok, reason=clip(reason), loss=loss, tokens=tokens))


def digest(attempt: int, step: int, sha256: bytes) -> rpb.RankFrame:
    return rpb.RankFrame(digest=rpb.StateDigest(attempt=attempt, step=step, sha256=sha256))


def close(step: int, reason: str) -> rpb.RankFrame:
    return rpb.RankFrame(close=rpb.CloseRank(step=step, reason=clip(reason)))


# ---------------------------------------------------------------- decoding


def parse(cls, body: bytes, limit: int):
    if len(body) > limit:
        raise MessageError(f"a frame of {len(body)} bytes is larger than the limit of {limit}")
    message = cls()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise MessageError(f"a frame of {len(body)} bytes is not a {cls.__name__}: {exc}") from None
    kind = message.WhichOneof("body")
    if kind is None:
        raise MessageError(f"a {cls.__name__} of {len(body)} bytes carries no message")
    return message, kind


def check_text(what: str, value: str, limit: int, *, empty: bool = True) -> None:
    if len(value) > limit:
        raise MessageError(f"{what} is {len(value)} characters long; the limit is {limit}")
    if not empty and not value:
        raise MessageError(f"{what} must not be empty")


def check_step(what: str, value: int) -> None:
    if not 0 <= value <= MAX_STEP:
        raise MessageError(f"{what} must be a step between 0 and {MAX_STEP}, got {value}")


def check_attempt(value: int) -> None:
    if not 0 < value <= MAX_STEP:
        raise MessageError(f"attempt must be between 1 and {MAX_STEP}, got {value}")


#: what a rank itself sends (the other RankFrame kinds come from relays only)
RANK_KINDS = frozenset({"hello", "begin", "vote", "digest", "close"})


def decode_rank_frame(body: bytes) -> tuple[str, object]:
    """(kind, message) of one rank -> coordinator frame; MessageError when it is bad."""
    message, kind = parse(rpb.RankFrame, body, MAX_RANK_FRAME_BYTES)
    if kind not in RANK_KINDS:
        raise MessageError(f"a {kind} frame comes from a relay only, not from a rank")
    return kind, check_rank_message(kind, getattr(message, kind))


def check_rank_message(kind: str, inner):
    """`inner`, the RankFrame's `kind` (one of RANK_KINDS), once every field is in bounds."""
    if kind == "hello":
        if inner.rank < 0:
            raise MessageError(f"hello from rank {inner.rank}: ranks are >= 0")
        check_text("job_id", inner.job_id, MAX_ID_CHARS, empty=False)
        check_text("replica_id", inner.replica_id, MAX_ID_CHARS, empty=False)
        check_text("ftar_address", inner.ftar_address, MAX_ADDRESS_CHARS, empty=False)
        check_text("state_address", inner.state_address, MAX_ADDRESS_CHARS, empty=False)
        check_text("incarnation", inner.incarnation, MAX_ID_CHARS)
        if len(inner.auth) > MAX_AUTH_BYTES:
            raise MessageError(f"hello auth is {len(inner.auth)} bytes; the limit is {MAX_AUTH_BYTES}")
        if len(inner.nonce) not in (0, auth.NONCE_BYTES):
            raise MessageError(f"hello nonce is {len(inner.nonce)} bytes; it must be {auth.NONCE_BYTES}")
    elif kind == "begin":
        check_step("begin step", inner.step)
    elif kind == "vote":
        check_attempt(inner.attempt)
        check_text("vote reason", inner.reason, MAX_REASON_CHARS)
        if inner.tokens < 0:
            raise MessageError(f"vote tokens must be >= 0, got {inner.tokens}")
    elif kind == "digest":
        check_attempt(inner.attempt)
        check_step("digest step", inner.step)
        if len(inner.sha256) != DIGEST_BYTES:
            raise MessageError(f"a digest is {DIGEST_BYTES} bytes, got {len(inner.sha256)}")
    elif kind == "close":
        check_step("close step", inner.step)
        check_text("close reason", inner.reason, MAX_REASON_CHARS)
    return inner


def decode_coordinator_frame(body: bytes) -> tuple[str, object]:
    """(kind, message) of one coordinator -> rank frame; MessageError when it is bad."""
    message, kind = parse(rpb.CoordinatorFrame, body, MAX_COORDINATOR_FRAME_BYTES)
    return kind, check_coordinator_message(kind, getattr(message, kind))


def check_coordinator_message(kind: str, inner):
    """`inner`, the CoordinatorFrame's `kind`, once every field is in bounds (a to_ranks is refused:
    only a relay takes one, fthsdp/step/relay_messages.py)."""
    if kind == "plan":
        check_attempt(inner.attempt)
        check_step("plan step", inner.step)
        if not inner.HasField("quorum"):
            raise MessageError(f"plan of attempt {inner.attempt} carries no quorum")
        p = inner.peers
        if not len(p.replica_ids) == len(p.ftar_addresses) == len(p.state_addresses):
            raise MessageError(f"plan of attempt {inner.attempt} has {len(p.replica_ids)} peer ids for "
                               f"{len(p.ftar_addresses)} FTAR and {len(p.state_addresses)} state addresses")
    elif kind == "no_plan":
        check_attempt(inner.attempt)
        if inner.kind not in (rpb.NoPlan.RETRY, rpb.NoPlan.FINISHED, rpb.NoPlan.FATAL):
            raise MessageError(f"no_plan kind {inner.kind} is not RETRY, FINISHED or FATAL")
        check_text("no_plan reason", inner.reason, MAX_REASON_CHARS)
    elif kind == "decision":
        check_attempt(inner.attempt)
        if inner.outcome not in (rpb.StepDecision.COMMIT, rpb.StepDecision.RETRY):
            raise MessageError(f"decision outcome {inner.outcome} is not COMMIT or RETRY")
        check_text("decision reason", inner.reason, MAX_REASON_CHARS)
    elif kind in ("finished", "refusal"):
        check_text(f"{kind} reason", inner.reason, MAX_REASON_CHARS)
    elif kind == "challenge":
        if len(inner.nonce) != auth.NONCE_BYTES:
            raise MessageError(f"a challenge nonce is {auth.NONCE_BYTES} bytes, got {len(inner.nonce)}")
    elif kind == "welcome":
        if len(inner.auth) > MAX_AUTH_BYTES:
            raise MessageError(f"welcome auth is {len(inner.auth)} bytes; the limit is {MAX_AUTH_BYTES}")
        check_text("welcome relay_address", inner.relay_address, MAX_ADDRESS_CHARS)
    elif kind == "to_ranks":
        raise MessageError("a to_ranks frame is for a relay, not for a rank")
    return inner


class FrameReader:
    """Splits a byte stream into frame bodies, refusing a length over `limit` before buffering it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        bodies = []
        while len(self.buffer) >= FRAME.size:
            (length,) = FRAME.unpack_from(self.buffer)
            if length > self.limit:
                raise MessageError(f"a frame announces {length} bytes; the limit is {self.limit}")
            end = FRAME.size + length
            if len(self.buffer) < end:
                break
            bodies.append(bytes(self.buffer[FRAME.size:end]))
            del self.buffer[:end]
        return bodies
