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

import mmap
import os
import threading
from pathlib import Path
from typing import Mapping

from protos import telemetry_ring as ring
from protos.telemetry_ring import Kind

ENV_TELEMETRY_FILE = ring.ENV_FILE

__all__ = ["ENV_TELEMETRY_FILE", "Kind", "Telemetry"]


def _ns(now: float) -> int:
    return max(int(now * 1e9), 1)


class Telemetry:
    """The writer of one rank's ring. Create it with `create` or `from_env`."""

    def __init__(self, path: Path, mm: mmap.mmap, capacity: int) -> None:
        self.path, self._mm, self.capacity = path, mm, capacity
        self._appended = 0
        self._lock = threading.Lock()

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
        """The ring the agent asked for, or None when it asked for none (not started by an agent)."""
        path = environ.get(ENV_TELEMETRY_FILE, "")
        return cls.create(path, replica_id=replica_id, rank=rank, now=now, capacity=capacity) if path else None

    def record_join(self, seq: int, kind: Kind, group: str, nbytes: int, now: float, *, group_size: int) -> int:
        """This rank joined collective `seq` of `group` (of `group_size` members), to move
        `nbytes`. Returns the token that `record_progress`/`record_done` take."""
        name = ring.check_group(group)
        if seq < 0 or nbytes < 0 or group_size < 1:
            raise ValueError(f"telemetry needs seq >= 0, nbytes >= 0 and group_size >= 1, got {seq}, "
                             f"{nbytes} and {group_size}.")
        with self._lock:
            token = self._appended
            at = ring.record_offset(self.capacity, token)
            odd = self._begin(at)
            self._mm[at:at + ring.RECORD_BYTES] = ring.pack_record(
                odd, int(kind), ring.State.JOINED, seq, _ns(now), nbytes, group_size, name)
            ring.U32.pack_into(self._mm, at, (odd + 1) & 0xFFFFFFFF)
            self._appended = token + 1
            ring.U64.pack_into(self._mm, ring.APPENDED_OFFSET, self._appended)
        return token

    def record_progress(self, token: int, sent_bytes: int, now: float) -> None:
        """This rank has sent `sent_bytes` of the collective so far."""
        with self._lock:
            if self._live(token):
                at = ring.record_offset(self.capacity, token)
                self._update(at, lambda: (ring.I64.pack_into(self._mm, at + ring.PROGRESS_NS_OFFSET, _ns(now)),
                                          ring.U64.pack_into(self._mm, at + ring.PROGRESS_BYTES_OFFSET,
                                                             max(sent_bytes, 0))))

    def record_done(self, token: int, now: float) -> None:
        """The collective completed on this rank."""
        with self._lock:
            if self._live(token):
                at = ring.record_offset(self.capacity, token)
                self._update(at, lambda: (ring.I64.pack_into(self._mm, at + ring.DONE_OFFSET, _ns(now)),
                                          ring.U8.pack_into(self._mm, at + ring.STATE_OFFSET, ring.State.DONE)))

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

    def _update(self, at: int, write) -> None:
        odd = self._begin(at)
        write()
        ring.U32.pack_into(self._mm, at, (odd + 1) & 0xFFFFFFFF)
