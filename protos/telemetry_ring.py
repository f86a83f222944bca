"""The telemetry ring: one trainer rank's record of its collectives, in a file its agent reads.

This is the contract between a trainer (the writer, `fthsdp.telemetry`) and its agent (the
reader, `agent.telemetry`); both import it from here. The file lives in a directory only the
agent's user can open (the agent names it in FTHSDP_TELEMETRY_FILE); no port is involved.

Layout, little-endian: a 128-byte header, then `capacity` records of RECORD_BYTES each.

    header  magic b"FTHSDPT1" | layout u32 | record_bytes u32 | capacity u32 | reserved u32
            | appended u64 (records ever appended; record i lies in slot i % capacity)
            | created_ns i64 | pid u32 | rank i32 | replica_id (64 bytes, UTF-8, NUL padded)
    record  version u32 (a sequence lock: odd while the writer changes the record)
            | kind u8 | state u8 (0 empty, 1 joined, 2 done) | flags u16 (bit 0: disturbed)
            | seq i64 | join_ns i64 | done_ns i64 | progress_ns i64 | nbytes u64
            | progress_bytes u64 | group_size u32 | reserved u32 | group (32 bytes, ASCII, NUL padded)

Times are CLOCK_MONOTONIC nanoseconds (`time.monotonic_ns()`), the same clock for every process
of a host, so the agent turns them into ages with its own clock and no skew between hosts ever
enters: what leaves the host is "joined 41.2 s ago", never a wall-clock time.

Identity of a collective across ranks: `group` names a communicator, `seq` counts the
collectives issued on it since it was formed (0, 1, 2, ...), the same on every member. A group
that is formed again (a restart, a new ring) must get a new name (e.g. with the quorum id).
`kind` says what it is; FTAR kinds are cross-replica (members: the same rank in every replica
of the ring), every other kind is intra-replica (members: ranks of the rank's own replica).
`progress_bytes` counts the bytes this rank has *sent* in the collective so far: a rank that
joined but never progresses stays at 0 while its ring neighbours move on.

A record is *disturbed* (flag bit 0) when the rank's own time before joining it includes work
its peers need not have done: writing a checkpoint, serving or fetching a catch-up, forming a
new ring. Its own time says nothing about the rank's speed, and the straggler analysis leaves
it out. Other flag bits are reserved (written 0, ignored when read).
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass

#: The environment variable in which an agent names a trainer's ring file.
ENV_FILE = "FTHSDP_TELEMETRY_FILE"
MAGIC = b"FTHSDPT1"
LAYOUT = 1
HEADER = struct.Struct("<8sIIIIQqIi64s")
HEADER_BYTES = 128
RECORD = struct.Struct("<IBBHqqqqQQII32s")
RECORD_BYTES = RECORD.size
#: A ring (header + records) stays under 1 MiB per rank.
MAX_RING_BYTES = 1 << 20
MAX_CAPACITY = (MAX_RING_BYTES - HEADER_BYTES) // RECORD_BYTES
DEFAULT_CAPACITY = 4096
MAX_GROUP_CHARS = 32
MAX_REPLICA_ID_CHARS = 64
GROUP_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$"
_GROUP = re.compile(GROUP_PATTERN)

#: Bounds of the summary an agent sends (controller.proto, TelemetryReport).
MAX_RANKS_PER_REPORT = 1024
MAX_GROUPS_PER_RANK = 16
MAX_WINDOWS_PER_GROUP = 8
MAX_WINDOW_COLLECTIVES = 4096

#: Fields the writer updates in place: the header's `appended`, and in a record its version,
#: state, done_ns, progress_ns and progress_bytes (offsets from the record's start).
APPENDED_OFFSET = 24
U8, U32, I64, U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<Q")
STATE_OFFSET = 5
#: Bits of a record's flags.
FLAG_DISTURBED = 1
DONE_OFFSET = 24
PROGRESS_NS_OFFSET = 32
PROGRESS_BYTES_OFFSET = 48

assert HEADER.size <= HEADER_BYTES and RECORD_BYTES == 96


class Kind(enum.IntEnum):
    """What a collective is. FTAR kinds are cross-replica; the others are intra-replica."""

    ALL_REDUCE = 1
    REDUCE_SCATTER = 2
    ALL_GATHER = 3
    BROADCAST = 4
    BARRIER = 5
    #: the replica's commit vote through its coordinator (every rank of the replica)
    VOTE = 6
    FTAR_ALL_REDUCE = 16

    @property
    def cross_replica(self) -> bool:
        return self >= Kind.FTAR_ALL_REDUCE


class State(enum.IntEnum):
    EMPTY = 0
    JOINED = 1
    DONE = 2


@dataclass(frozen=True, slots=True)
class Record:
    """One collective as a rank saw it (times in CLOCK_MONOTONIC ns; done_ns 0: not done)."""

    index: int
    kind: Kind
    state: State
    seq: int
    join_ns: int
    done_ns: int
    progress_ns: int
    nbytes: int
    progress_bytes: int
    group_size: int
    group: str
    #: the rank's own time before it includes uneven work (see the module docstring)
    disturbed: bool = False

    @property
    def last_event_ns(self) -> int:
        return max(self.join_ns, self.done_ns, self.progress_ns)


@dataclass(frozen=True, slots=True)
class Header:
    capacity: int
    appended: int
    created_ns: int
    pid: int
    rank: int
    replica_id: str


def check_group(group: str) -> bytes:
    """The group name as stored; ValueError names a bad one."""
    if not group or len(group) > MAX_GROUP_CHARS or not _GROUP.match(group):
        raise ValueError(f"telemetry group {group[:40]!r} must be 1..{MAX_GROUP_CHARS} characters of "
                         f"letters, digits and ._:@/+=- (starting with a letter or digit).")
    return group.encode("ascii")


def ring_bytes(capacity: int) -> int:
    return HEADER_BYTES + capacity * RECORD_BYTES


def check_capacity(capacity: int) -> int:
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"telemetry capacity must be 1..{MAX_CAPACITY} records (the ring stays under "
                         f"{MAX_RING_BYTES} bytes), got {capacity}.")
    return capacity


def pack_header(capacity: int, appended: int, created_ns: int, pid: int, rank: int, replica_id: str) -> bytes:
    raw = replica_id.encode()
    if len(raw) > MAX_REPLICA_ID_CHARS:
        raise ValueError(f"replica_id {replica_id[:40]!r} is longer than {MAX_REPLICA_ID_CHARS} bytes.")
    body = HEADER.pack(MAGIC, LAYOUT, RECORD_BYTES, capacity, 0, appended, created_ns, pid, rank, raw)
    return body.ljust(HEADER_BYTES, b"\0")


def unpack_header(buf) -> Header:
    """The header of a ring; ValueError says what is wrong with it."""
    if len(buf) < HEADER_BYTES:
        raise ValueError(f"telemetry ring is {len(buf)} bytes, shorter than its {HEADER_BYTES}-byte header.")
    magic, layout, record_bytes, capacity, _, appended, created_ns, pid, rank, raw = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ValueError(f"telemetry ring has magic {magic!r}, expected {MAGIC!r}.")
    if layout != LAYOUT or record_bytes != RECORD_BYTES:
        raise ValueError(f"telemetry ring layout {layout} with {record_bytes}-byte records is not layout "
                         f"{LAYOUT} with {RECORD_BYTES}-byte records.")
    check_capacity(capacity)
    if len(buf) != ring_bytes(capacity):
        raise ValueError(f"telemetry ring is {len(buf)} bytes; {capacity} records need {ring_bytes(capacity)}.")
    try:
        replica_id = raw.rstrip(b"\0").decode()
    except UnicodeDecodeError:
        raise ValueError("telemetry ring's replica_id is not UTF-8.") from None
    return Header(capacity, appended, created_ns, pid, rank, replica_id)


def pack_record(version: int, kind: int, state: int, seq: int, join_ns: int, nbytes: int, group_size: int,
                group: bytes, disturbed: bool = False) -> bytes:
    flags = FLAG_DISTURBED if disturbed else 0
    return RECORD.pack(version, kind, state, flags, seq, join_ns, 0, join_ns, nbytes, 0, group_size, 0, group)


def unpack_record(index: int, raw: bytes) -> Record | None:
    """One record, or None when it is empty or does not make sense (never trusted blindly)."""
    (_, kind, state, flags, seq, join_ns, done_ns, progress_ns, nbytes, progress_bytes, group_size, _,
     group) = RECORD.unpack(raw)
    if state not in (State.JOINED, State.DONE) or kind not in Kind._value2member_map_:
        return None
    if seq < 0 or join_ns <= 0 or (state == State.DONE and done_ns < join_ns) or group_size < 1:
        return None
    try:
        name = group.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        return None
    if not _GROUP.match(name):
        return None
    return Record(index, Kind(kind), State(state), seq, join_ns, done_ns if state == State.DONE else 0,
                  max(progress_ns, join_ns), nbytes, progress_bytes, group_size, name, bool(flags & FLAG_DISTURBED))


def record_offset(capacity: int, index: int) -> int:
    return HEADER_BYTES + (index % capacity) * RECORD_BYTES
