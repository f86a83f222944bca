"""Reading a trainer's telemetry ring and summarizing it for the controller.

`read_ring` takes a consistent copy of a ring file (`protos.telemetry_ring`) without trusting
it: sizes are checked against the header, every record is validated, and a record the trainer
was changing while we read is read again (its bytes must match twice) or left out. It reads
the file with pread, never a shared mapping, so a trainer that truncates its file cannot crash
the agent.

`summarize_rank` is pure (records and `now_ns` in, a `RankTelemetry` message out): per group,
the last collective joined and done, the oldest one still pending (how long, how many bytes
sent, how long since it last moved) and the newest complete windows (collectives with seq in
[i·W, (i+1)·W), W = `window_collectives`; complete once the rank joined a later one) with their
own time and wait time, disturbed when any of their records is (see controller.proto,
TelemetryWindow).
"""

from __future__ import annotations

import heapq
import os
from collections import defaultdict
from typing import Iterable, Mapping

from protos import controller_pb2 as pb
from protos import telemetry_ring as ring
from protos.telemetry_ring import Header, Record, State

#: Tries to get a stable copy of a record the trainer keeps changing.
_RETRIES = 3


#: Rings live in memory-backed storage when the host has it (no disk writeback of their pages).
SHM_DIR = "/dev/shm"


def ring_dir() -> str | None:
    """Where a fresh ring directory goes by default: /dev/shm if usable, else the temp dir."""
    return SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK) else None


class RingError(ValueError):
    """The ring file is missing or malformed; the message says which and why."""


def read_ring(path: str | os.PathLike[str]) -> tuple[Header, list[Record]]:
    """The header and the valid records (oldest first) of the ring at `path`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise RingError(f"cannot open telemetry ring {path}: {exc.strerror}") from None
    try:
        return _read(fd, path)
    except OSError as exc:
        raise RingError(f"cannot read telemetry ring {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _read(fd: int, path) -> tuple[Header, list[Record]]:
    size = os.fstat(fd).st_size
    if size > ring.ring_bytes(ring.MAX_CAPACITY):
        raise RingError(f"telemetry ring {path} is {size} bytes, more than any ring may hold.")
    first, second = os.pread(fd, size, 0), os.pread(fd, size, 0)
    if len(first) != size or len(second) != size:
        raise RingError(f"telemetry ring {path} changed size while it was read.")
    try:
        header = ring.unpack_header(second)
    except ValueError as exc:
        raise RingError(f"telemetry ring {path}: {exc}") from None
    records = []
    for index in range(max(header.appended - header.capacity, 0), header.appended):
        at = ring.record_offset(header.capacity, index)
        raw = _stable(fd, at, first[at:at + ring.RECORD_BYTES], second[at:at + ring.RECORD_BYTES])
        record = ring.unpack_record(index, raw) if raw is not None else None
        if record is not None:
            records.append(record)
    return header, records


def _stable(fd: int, at: int, a: bytes, b: bytes) -> bytes | None:
    """The record's bytes if two reads agree and it is not being written (even version)."""
    for _ in range(_RETRIES):
        if a == b and len(a) == ring.RECORD_BYTES and ring.U32.unpack_from(a)[0] % 2 == 0:
            return a
        a, b = b, os.pread(fd, ring.RECORD_BYTES, at)
    return None


def own_times(records: Iterable[Record]) -> dict[int, int]:
    """Per record index, the ns the rank spent on its own before joining it: from its latest
    earlier event (a join, or a completion that came before this join) to this join."""
    out: dict[int, int] = {}
    done: list[int] = []
    released = last_join = None
    for r in sorted(records, key=lambda r: r.join_ns):
        while done and done[0] <= r.join_ns:
            t = heapq.heappop(done)
            released = t if released is None else max(released, t)
        earlier = [t for t in (released, last_join) if t is not None]
        if earlier:
            out[r.index] = r.join_ns - max(earlier)
        last_join = r.join_ns
        if r.state == State.DONE:
            heapq.heappush(done, r.done_ns)
    return out


def summarize_rank(replica_id: str, rank: int, header: Header, records: list[Record], now_ns: int,
                   window_collectives: int, sent: Mapping[str, int] | None = None) -> pb.RankTelemetry:
    """The summary of one rank's ring as the controller wants it (see the module docstring).
    Windows up to `sent[group]` went out before and are left out."""
    last = max((r.last_event_ns for r in records), default=header.created_ns)
    out = pb.RankTelemetry(replica_id=replica_id, rank=rank, idle_s=_age(now_ns, last),
                           recording_s=_age(now_ns, header.created_ns))
    by_group: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_group[r.group].append(r)
    recent = sorted(by_group, key=lambda g: max(r.last_event_ns for r in by_group[g]), reverse=True)
    own = own_times(records)
    for name in sorted(recent[:ring.MAX_GROUPS_PER_RANK]):
        out.groups.append(_group(name, by_group[name], own, now_ns, window_collectives, (sent or {}).get(name, -1)))
    return out


def _group(name: str, records: list[Record], own: dict[int, int], now_ns: int, w: int,
           sent: int) -> pb.GroupTelemetry:
    latest = max(records, key=lambda r: r.index)
    done = [r.seq for r in records if r.state == State.DONE]
    g = pb.GroupTelemetry(group=name, kind=int(latest.kind), size=latest.group_size,
                          last_joined_seq=max(r.seq for r in records), last_done_seq=max(done, default=-1),
                          pending_seq=-1)
    pending = [r for r in records if r.state == State.JOINED]
    if pending:
        p = min(pending, key=lambda r: r.seq)
        g.pending_seq, g.pending_s, g.pending_nbytes = p.seq, _age(now_ns, p.join_ns), p.nbytes
        g.pending_sent_bytes, g.pending_idle_s = p.progress_bytes, _age(now_ns, p.progress_ns)
    windows: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        windows[r.seq // w].append(r)
    # A window is complete once the rank joined a collective past it and everything in it is
    # done (seqs may be sparse: a runtime can number collectives by step and position).
    past = g.last_joined_seq // w
    oldest = min(records, key=lambda r: r.index).seq // w  # the ring may have lost its start
    complete = [i for i, rs in windows.items() if sent < i < past and i > oldest
                and all(r.state == State.DONE and r.index in own for r in rs)]
    for i in sorted(complete)[-ring.MAX_WINDOWS_PER_GROUP:]:
        rs = _one_per_seq(windows[i])
        g.windows.append(pb.TelemetryWindow(index=i, own_s=sum(own[r.index] for r in rs) / 1e9,
                                            wait_s=sum(r.done_ns - r.join_ns for r in rs) / 1e9,
                                            disturbed=any(r.disturbed for r in rs)))
    return g


def _one_per_seq(records: list[Record]) -> list[Record]:
    """A seq recorded twice (a retried collective) counts once: its latest record."""
    latest: dict[int, Record] = {}
    for r in records:
        if r.seq not in latest or r.index > latest[r.seq].index:
            latest[r.seq] = r
    return list(latest.values())


def _age(now_ns: int, then_ns: int) -> float:
    return max(now_ns - then_ns, 0) / 1e9


class Collector:
    """The agent's side of collection: read the rings of the trainers it runs, summarize them,
    and remember which windows the controller has (per ring: a restarted trainer starts afresh;
    a report that did not arrive is sent again with the next one)."""

    def __init__(self, host_id: str, window_collectives: int) -> None:
        self.host_id, self.window = host_id, window_collectives
        self._sent: dict[tuple[int, int], dict[str, int]] = {}
        self._unconfirmed: dict[tuple[int, int], dict[str, int]] = {}
        #: why each slot's ring could not be read last time
        self.problems: dict[int, str] = {}

    def collect(self, trainers: list[tuple[int, str, int, str]], now_ns: int) -> pb.TelemetryReport:
        """trainers: (slot, replica_id, rank, ring path) of every trainer running now."""
        report = pb.TelemetryReport(host_id=self.host_id, window_collectives=self.window)
        self._unconfirmed = {}
        for slot, replica_id, rank, path in trainers[:ring.MAX_RANKS_PER_REPORT]:
            try:
                header, records = read_ring(path)
                if (header.replica_id, header.rank) != (replica_id, rank):
                    raise RingError(f"telemetry ring {path} belongs to {header.replica_id}/{header.rank}, but slot "
                                    f"{slot} runs {replica_id}/{rank}")
            except RingError as exc:
                self.problems[slot] = str(exc)
                continue
            self.problems.pop(slot, None)
            key = (slot, header.created_ns)
            summary = summarize_rank(replica_id, rank, header, records, now_ns, self.window, self._sent.get(key))
            self._unconfirmed[key] = {g.group: g.windows[-1].index for g in summary.groups if g.windows}
            report.ranks.append(summary)
        return report

    def delivered(self) -> None:
        """The last collected report reached the controller: its windows are not sent again."""
        for key, windows in self._unconfirmed.items():
            self._sent.setdefault(key, {}).update(windows)
        self._sent = {k: v for k, v in self._sent.items() if k in self._unconfirmed}
        self._unconfirmed = {}
