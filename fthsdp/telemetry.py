"""Per-rank collective telemetry: a bounded ring in a memory-mapped file that the agent reads.

Each rank records, for every collective it takes part in, when it joined, how far it got
(bytes sent) and when it completed. The ring holds the last `capacity` collectives in fixed
records (`protos.telemetry_ring`: 96 bytes each, under 1 MiB per rank), so recording never
allocates and never blocks on I/O: the kernel's page cache is the only buffer. The agent that
started the trainer names the file in FTHSDP_TELEMETRY_FILE; without it, `from_env` returns
None and nothing is recorded.

    telemetry = Telemetry.from_env(replica_id, rank)
    token = telemetry.record_join(seq, Kind.ALL_REDUCE, "replica", nbytes, time.monotonic(), group_size=8)
    telemetry.record_progress(token, sent_bytes, time.monotonic())
    telemetry.record_done(token, time.monotonic())

Times are `time.monotonic()` seconds (CLOCK_MONOTONIC, the same clock as the agent's).
Thread-safe: one lock around each record's update.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from protos import telemetry_ring as ring
from protos.telemetry_ring import Kind

ENV_TELEMETRY_FILE = ring.ENV_FILE
log = logging.getLogger(__name__)

__all__ = ["ENV_TELEMETRY_FILE", "Collectives", "Kind", "Telemetry"]


def _ns(now: float) -> int:
    return max(int(now * 1e9), 1)


class Telemetry:
    """The writer of one rank's ring. Create it with `create` or `from_env`."""

    def __init__(self, path: Path, mm: mmap.mmap, capacity: int) -> None:
        self.path, self._mm, self.capacity = path, mm, capacity
        self._appended = 0
        self._lock = threading.Lock()
        self._groups: dict[str, bytes] = {}

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, replica_id: str, rank: int, now: float,
               capacity: int = ring.DEFAULT_CAPACITY) -> "Telemetry":
        """A fresh ring at `path` (an older file there is replaced atomically: the agent never
        sees half a header)."""
        ring.check_capacity(capacity)
        path = Path(path)
        header = ring.pack_header(capacity, 0, _ns(now), os.getpid(), rank, replica_id)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, ring.ring_bytes(capacity))
            os.pwrite(fd, header, 0)
            mm = mmap.mmap(fd, ring.ring_bytes(capacity), access=mmap.ACCESS_WRITE)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        return cls(path, mm, capacity)

    @classmethod
    def from_env(cls, replica_id: str, rank: int, now: float, environ: Mapping[str, str] = os.environ,
                 capacity: int = ring.DEFAULT_CAPACITY) -> "Telemetry | None":
        """The ring the agent asked for, or None when it asked for none (not started by an agent)
        or it cannot be made (logged: training goes on without telemetry)."""
        path = environ.get(ENV_TELEMETRY_FILE, "")
        if not path:
            return None
        try:
            return cls.create(path, replica_id=replica_id, rank=rank, now=now, capacity=capacity)
        except (OSError, ValueError) as exc:
            log.warning("replica %s rank %s: no collective telemetry: cannot create the ring %s: %s", replica_id,
                        rank, path, exc)
            return None

    def record_join(self, seq: int, kind: Kind, group: str, nbytes: int, now: float, *, group_size: int,
                    disturbed: bool = False) -> int:
        """This rank joined collective `seq` of `group` (of `group_size` members), to move
        `nbytes`; `disturbed`: its own time before it includes work its peers need not have done
        (protos/telemetry_ring.py). Returns the token that `record_progress`/`record_done` take."""
        name = self._groups.get(group)
        if name is None:  # checked once per name: groups are few
            name = self._groups[group] = ring.check_group(group)
        if seq < 0 or nbytes < 0 or group_size < 1:
            raise ValueError(f"telemetry needs seq >= 0, nbytes >= 0 and group_size >= 1, got {seq}, "
                             f"{nbytes} and {group_size}.")
        with self._lock:
            token = self._appended
            at = ring.record_offset(self.capacity, token)
            odd = self._begin(at)
            self._mm[at:at + ring.RECORD_BYTES] = ring.pack_record(
                odd, int(kind), ring.State.JOINED, seq, _ns(now), nbytes, group_size, name, disturbed)
            ring.U32.pack_into(self._mm, at, (odd + 1) & 0xFFFFFFFF)
            self._appended = token + 1
            ring.U64.pack_into(self._mm, ring.APPENDED_OFFSET, self._appended)
        return token

    def record_progress(self, token: int, sent_bytes: int, now: float) -> None:
        """This rank has sent `sent_bytes` of the collective so far."""
        with self._lock:
            if self._live(token):
                at = ring.record_offset(self.capacity, token)
                odd = self._begin(at)
                ring.I64.pack_into(self._mm, at + ring.PROGRESS_NS_OFFSET, _ns(now))
                ring.U64.pack_into(self._mm, at + ring.PROGRESS_BYTES_OFFSET, max(sent_bytes, 0))
                ring.U32.pack_into(self._mm, at, (odd + 1) & 0xFFFFFFFF)

    def record_done(self, token: int, now: float) -> None:
        """The collective completed on this rank."""
        with self._lock:
            if self._live(token):
                at = ring.record_offset(self.capacity, token)
                odd = self._begin(at)
                ring.I64.pack_into(self._mm, at + ring.DONE_OFFSET, _ns(now))
                ring.U8.pack_into(self._mm, at + ring.STATE_OFFSET, ring.State.DONE)
                ring.U32.pack_into(self._mm, at, (odd + 1) & 0xFFFFFFFF)

    def close(self) -> None:
        with self._lock:
            if not self._mm.closed:
                self._mm.close()

    def _live(self, token: int) -> bool:
        """The token's record is still in the ring (not overwritten by `capacity` newer ones)."""
        return not self._mm.closed and 0 <= token < self._appended and self._appended - token <= self.capacity

    def _begin(self, at: int) -> int:
        """Mark the record at `at` as changing (its version odd: a reader retries or skips it)."""
        odd = ((ring.U32.unpack_from(self._mm, at)[0] + 1) | 1) & 0xFFFFFFFF
        ring.U32.pack_into(self._mm, at, odd)
        return odd



class Collectives:
    """How the runtime numbers and records the collectives of a replica step.

    Every rank of a replica issues the same collectives in the same order, and every replica
    in a ring the same FTAR ops, so numbering them by step keeps them aligned across ranks and
    replicas -- also after a restart or a catch-up jump, and through retries (a retried
    collective gets the same number again):

        group "replica" (every rank of the replica):  seq = step * INTRA_PER_STEP + position
            position 0: the plan (begin -> plan), 1..: the step's collectives in order,
            INTRA_PER_STEP - 1: the vote (vote -> decision)
        group "ftar.q<quorum id>" (rank k of every replica in the ring): seq = step * FTAR_PER_STEP + i

    A rank that does work its peers need not do (a checkpoint write, serving or fetching a
    catch-up) calls `disturb()`: its records from then to the next step's plan (whose own time
    holds what came after the vote) are marked disturbed, and so is the step in which a new
    FTAR quorum formed. Without a ring (`Telemetry.from_env` gave None) every call returns at once.
    """

    INTRA = "replica"
    INTRA_PER_STEP = 32
    FTAR_PER_STEP = 16

    def __init__(self, telemetry: Telemetry | None, world_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.telemetry, self.world_size, self.clock = telemetry, world_size, clock
        self.step = 0
        self._intra = self._ftar = 0
        self.plan_token: int | None = None
        self.vote_token: int | None = None
        self.disturbed = False
        self._quorum_id: int | None = None

    def disturb(self) -> None:
        """This rank does uneven work now: its records up to the next step's plan are disturbed."""
        self.disturbed = True

    def begin(self, step: int) -> None:
        """A step attempt begins (its plan is asked for): positions count from here."""
        self.step, self._intra, self._ftar = step, 0, 0
        self.plan_token = self._join(step * self.INTRA_PER_STEP, Kind.BARRIER, self.INTRA, 0, self.world_size)
        self.disturbed = False  # the plan's own time held the last of it

    def planned(self, step: int) -> None:
        """The plan (or a refusal) arrived; collectives from here count toward `step`."""
        self.done(self.plan_token)
        self.plan_token, self.step = None, step

    def join(self, kind: Kind, nbytes: int) -> int | None:
        """The next intra-replica collective of this step."""
        self._intra = min(self._intra + 1, self.INTRA_PER_STEP - 2)
        return self._join(self.step * self.INTRA_PER_STEP + self._intra, kind, self.INTRA, nbytes, self.world_size)

    def join_ftar(self, quorum_id: int, members: int, nbytes: int) -> int | None:
        if quorum_id != self._quorum_id:  # a new ring was formed for this step
            self.disturbed = self.disturbed or self._quorum_id is not None
            self._quorum_id = quorum_id
        seq = self.step * self.FTAR_PER_STEP + min(self._ftar, self.FTAR_PER_STEP - 1)
        self._ftar += 1
        return self._join(seq, Kind.FTAR_ALL_REDUCE, f"ftar.q{quorum_id}", nbytes, members)

    def vote(self) -> None:
        self.vote_token = self._join((self.step + 1) * self.INTRA_PER_STEP - 1, Kind.VOTE, self.INTRA, 0,
                                     self.world_size)

    def decided(self) -> None:
        self.done(self.vote_token)
        self.done(self.plan_token)  # a decision that came instead of a plan
        self.vote_token = self.plan_token = None

    def done(self, token: int | None) -> None:
        if token is not None and self.telemetry is not None:
            self.telemetry.record_done(token, self.clock())

    def _join(self, seq: int, kind: Kind, group: str, nbytes: int, size: int) -> int | None:
        if self.telemetry is None:
            return None
        return self.telemetry.record_join(seq, kind, group, nbytes, self.clock(), group_size=size,
                                          disturbed=self.disturbed)
