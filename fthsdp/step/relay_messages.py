"""The frames between a relay and the replica's coordinator (protos/replica.proto), checked.

A relay's connection up authenticates like a rank's: the coordinator's challenge, a
`relay_hello` tagged under the coordinator key of the job secret over every field, that
nonce and the relay's own fresh nonce, then a welcome tagged over the relay's identity and
both nonces (labels of their own: a rank's tag never passes as a relay's). After it, the
relay sends only the relay kinds (RELAY_KINDS), every list of ranks in them bounded by
MAX_GROUP_RANKS; a rank's own kinds on that connection are refused, and the relay kinds
on a rank's connection too (fthsdp/step/messages.py).

Down, a `to_ranks` frame carries serialized CoordinatorFrames for single ranks; the relay
checks each (a to_ranks inside a to_ranks is refused) before writing it.
"""

from __future__ import annotations

from ftar_kernels import auth
from fthsdp.settings import MAX_RELAY_GROUP_RANKS
from fthsdp.step.messages import (DIGEST_BYTES, MAX_ADDRESS_CHARS, MAX_AUTH_BYTES, MAX_COORDINATOR_FRAME_BYTES,
                                  MAX_ID_CHARS, MAX_REASON_CHARS, MessageError, RANK_KINDS, check_attempt,
                                  check_coordinator_message, check_rank_message, check_step, check_text, clip,
                                  decode_coordinator_frame, parse, signed_hello)
from protos import replica_pb2 as rpb

#: the most ranks one relay serves (a group of the relay tree)
MAX_GROUP_RANKS = MAX_RELAY_GROUP_RANKS
#: relay -> coordinator frames: a group's digests (1,024 x 32 bytes) are the largest
MAX_RELAY_FRAME_BYTES = 64 << 10
#: what a relay sends up besides its hello
RELAY_KINDS = frozenset({"relayed", "group_begin", "group_vote", "group_digests", "rank_left"})
#: what a relay forwards one rank at a time (the rest goes up aggregated)
RELAYED_KINDS = frozenset({"hello", "close"})


# ---------------------------------------------------------------- building frames


def relay_hello(group: int, fanout: int, world_size: int, job_id: str, replica_id: str, address: str,
                incarnation: str) -> rpb.RankFrame:
    return rpb.RankFrame(relay_hello=rpb.RelayHello(group=group, fanout=fanout, world_size=world_size, job_id=job_id,
                                                    replica_id=replica_id, address=address, incarnation=incarnation))


def _fields(h: rpb.RelayHello) -> tuple:
    return (h.job_id, h.replica_id, h.group, h.fanout, h.world_size, h.address, h.incarnation, h.nonce)


def sign_relay_hello(key: bytes | None, hello_frame: rpb.RankFrame, challenge_nonce: bytes) -> rpb.RankFrame:
    return signed_hello(key, hello_frame, "relay hello", _fields, challenge_nonce)


def relay_hello_is_authentic(key: bytes, h: rpb.RelayHello, challenge_nonce: bytes) -> bool:
    return len(h.nonce) == auth.NONCE_BYTES and auth.verify(key, h.auth, "relay hello", *_fields(h), challenge_nonce)


def relay_welcome(key: bytes | None, h: rpb.RelayHello, challenge_nonce: bytes) -> rpb.CoordinatorFrame:
    tag = auth.tag(key, "relay welcome", *_fields(h), challenge_nonce) if key else b""
    return rpb.CoordinatorFrame(welcome=rpb.Welcome(auth=tag))


def relay_welcome_is_authentic(key: bytes, w: rpb.Welcome, h: rpb.RelayHello, challenge_nonce: bytes) -> bool:
    return not w.relay_address and auth.verify(key, w.auth, "relay welcome", *_fields(h), challenge_nonce)


def relayed(rank: int, frame: rpb.RankFrame) -> rpb.RankFrame:
    return rpb.RankFrame(relayed=rpb.Relayed(rank=rank, frame=frame))


def group_begin(step: int, ranks) -> rpb.RankFrame:
    return rpb.RankFrame(group_begin=rpb.GroupBegin(step=step, ranks=ranks))


def group_vote(attempt: int, ok: bool, ranks, reason: str = "", loss_sum: float = 0.0,
               tokens: int = 0) -> rpb.RankFrame:
    return rpb.RankFrame(group_vote=rpb.GroupVote(attempt=attempt, ok=ok, ranks=ranks, reason=clip(reason),
                                                  loss_sum=loss_sum, tokens=tokens))


def group_digests(attempt: int, step: int, digests) -> rpb.RankFrame:
    """`digests`: (rank, sha256) pairs."""
    return rpb.RankFrame(group_digests=rpb.GroupDigests(attempt=attempt, step=step, ranks=[r for r, _ in digests],
                                                        sha256=[d for _, d in digests]))


def rank_left(rank: int, reason: str) -> rpb.RankFrame:
    return rpb.RankFrame(rank_left=rpb.RankLeft(rank=rank, reason=clip(reason)))


def to_ranks(frames) -> rpb.CoordinatorFrame:
    """`frames`: (rank, CoordinatorFrame) pairs, each serialized once here."""
    return rpb.CoordinatorFrame(to_ranks=rpb.ToRanks(frames=[rpb.Addressed(rank=r, frame=f.SerializeToString())
                                                             for r, f in frames]))


# ---------------------------------------------------------------- decoding


def _check_ranks(what: str, ranks, *, empty: bool = False) -> None:
    if len(ranks) > MAX_GROUP_RANKS:
        raise MessageError(f"{what} names {len(ranks)} ranks; a group has at most {MAX_GROUP_RANKS}")
    if not empty and not ranks:
        raise MessageError(f"{what} names no rank")
    if ranks and min(ranks) < 0:
        raise MessageError(f"{what} names rank {min(ranks)}: ranks are >= 0")
    if len(set(ranks)) != len(ranks):
        raise MessageError(f"{what} names a rank twice: {list(ranks)[:16]}")


def check_relay_hello(h: rpb.RelayHello) -> rpb.RelayHello:
    if h.group < 1:
        raise MessageError(f"relay_hello for group {h.group}: relays serve groups >= 1")
    if not 1 <= h.fanout <= MAX_GROUP_RANKS:
        raise MessageError(f"relay_hello fanout must be 1..{MAX_GROUP_RANKS}, got {h.fanout}")
    check_text("relay job_id", h.job_id, MAX_ID_CHARS, empty=False)
    check_text("relay replica_id", h.replica_id, MAX_ID_CHARS, empty=False)
    check_text("relay address", h.address, MAX_ADDRESS_CHARS, empty=False)
    check_text("relay incarnation", h.incarnation, MAX_ID_CHARS)
    if len(h.auth) > MAX_AUTH_BYTES:
        raise MessageError(f"relay_hello auth is {len(h.auth)} bytes; the limit is {MAX_AUTH_BYTES}")
    if len(h.nonce) not in (0, auth.NONCE_BYTES):
        raise MessageError(f"relay_hello nonce is {len(h.nonce)} bytes; it must be {auth.NONCE_BYTES}")
    return h


def decode_first_frame(body: bytes) -> tuple[str, object]:
    """The first frame on a connection to the coordinator: a rank's hello or a relay's."""
    message, kind = parse(rpb.RankFrame, body, MAX_RELAY_FRAME_BYTES)
    if kind == "relay_hello":
        return kind, check_relay_hello(message.relay_hello)
    if kind not in RANK_KINDS:
        raise MessageError(f"a {kind} frame before this connection's hello")
    return kind, check_rank_message(kind, getattr(message, kind))


def decode_relay_frame(body: bytes) -> tuple[str, object]:
    """(kind, message) of one frame a relay sent up after its hello; MessageError when it is bad."""
    message, kind = parse(rpb.RankFrame, body, MAX_RELAY_FRAME_BYTES)
    if kind not in RELAY_KINDS:
        raise MessageError(f"a relay sends only {sorted(RELAY_KINDS)}, got a {kind}")
    inner = getattr(message, kind)
    if kind == "relayed":
        if inner.rank < 0:
            raise MessageError(f"a relayed frame of rank {inner.rank}: ranks are >= 0")
        what = inner.frame.WhichOneof("body")
        if what not in RELAYED_KINDS:
            raise MessageError(f"a relay forwards a rank's {sorted(RELAYED_KINDS)} one by one, got a {what}")
        check_rank_message(what, getattr(inner.frame, what))
        if what == "hello" and inner.frame.hello.rank != inner.rank:
            raise MessageError(f"a relayed hello of rank {inner.frame.hello.rank} sent for rank {inner.rank}")
    elif kind == "group_begin":
        check_step("group begin step", inner.step)
        _check_ranks("group begin", inner.ranks)
    elif kind == "group_vote":
        check_attempt(inner.attempt)
        _check_ranks("group vote", inner.ranks)
        check_text("group vote reason", inner.reason, MAX_REASON_CHARS)
        if inner.tokens < 0:
            raise MessageError(f"group vote tokens must be >= 0, got {inner.tokens}")
        if not inner.ok and len(inner.ranks) != 1:
            raise MessageError(f"a group's no names the one rank that said it, got {len(inner.ranks)} ranks")
    elif kind == "group_digests":
        check_attempt(inner.attempt)
        check_step("group digests step", inner.step)
        _check_ranks("group digests", inner.ranks)
        if len(inner.sha256) != len(inner.ranks):
            raise MessageError(f"group digests name {len(inner.ranks)} ranks and carry {len(inner.sha256)} digests")
        bad = next((len(d) for d in inner.sha256 if len(d) != DIGEST_BYTES), None)
        if bad is not None:
            raise MessageError(f"a digest is {DIGEST_BYTES} bytes, got {bad}")
    elif kind == "rank_left":
        if inner.rank < 0:
            raise MessageError(f"rank_left of rank {inner.rank}: ranks are >= 0")
        check_text("rank_left reason", inner.reason, MAX_REASON_CHARS)
    return kind, inner


def decode_to_ranks(message: rpb.ToRanks) -> list[tuple[int, str, bytes]]:
    """(rank, kind, serialized frame) of each frame of a to_ranks; MessageError when one is bad."""
    out = []
    for item in message.frames:
        if item.rank < 0:
            raise MessageError(f"a to_ranks frame for rank {item.rank}: ranks are >= 0")
        if len(item.frame) > MAX_COORDINATOR_FRAME_BYTES:
            raise MessageError(f"a to_ranks frame of {len(item.frame)} bytes is over {MAX_COORDINATOR_FRAME_BYTES}")
        kind, _ = decode_coordinator_frame(item.frame)  # a to_ranks inside is refused there
        out.append((item.rank, kind, item.frame))
    return out


def decode_down_frame(body: bytes) -> tuple[str, object]:
    """A frame the coordinator sent a relay: ("to_ranks", decode_to_ranks(...)) or a frame for
    every rank of the group, as (kind, message)."""
    message, kind = parse(rpb.CoordinatorFrame, body, MAX_COORDINATOR_FRAME_BYTES)
    if kind == "to_ranks":
        return kind, decode_to_ranks(message.to_ranks)
    return kind, check_coordinator_message(kind, getattr(message, kind))
