"""Telemetry summaries from agents, as the analyzers read them. Pure.

An agent reports, per rank it runs, per communicator group: the last collective joined and
done, the oldest collective joined and not done, and statistics of recent complete windows
(see protos/controller.proto, TelemetryReport). Durations and ages are measured on the host's
own clock; the controller anchors them at the moment it received the report, so hosts' clocks
never meet. `check_report` bounds every field before anything is kept.

A collective is named by its group and its seq. Intra-replica groups are scoped by the
replica (`GroupKey(group, replica_id, -1)`: members are ranks of that replica); cross-replica
(FTAR) groups by the rank position (`GroupKey(group, "", rank)`: members are rank `rank` of
every replica in the ring).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

from controller.core.checks import check_id
from controller.core.errors import InvalidArgument
from protos.telemetry_ring import (GROUP_PATTERN, MAX_GROUP_CHARS, MAX_GROUPS_PER_RANK, MAX_RANKS_PER_REPORT,
                                   MAX_WINDOW_COLLECTIVES, MAX_WINDOWS_PER_GROUP, Kind)

MAX_KIND = 255
_FIRST_CROSS = int(Kind.FTAR_ALL_REDUCE)
_GROUP = re.compile(GROUP_PATTERN)

RankKey = tuple[str, int]


# Reports are tuples (NamedTuple): a 32,768-rank job sends ~100,000 of them per interval, and
# the controller decodes, keeps and scans them on every analysis.


class Window(NamedTuple):
    index: int
    own_s: float
    wait_s: float
    #: the own time includes work the rank's peers need not have done: not judged
    disturbed: bool = False


class GroupReport(NamedTuple):
    group: str
    kind: int
    size: int
    last_joined_seq: int
    last_done_seq: int
    #: the oldest collective joined and not done; -1: none
    pending_seq: int = -1
    pending_s: float = 0.0
    pending_nbytes: int = 0
    pending_sent_bytes: int = 0
    pending_idle_s: float = 0.0
    windows: tuple[Window, ...] = ()

    @property
    def cross_replica(self) -> bool:
        return self.kind >= _FIRST_CROSS

    @property
    def kind_name(self) -> str:
        return Kind(self.kind).name.lower() if self.kind in Kind._value2member_map_ else f"kind {self.kind}"


class RankReport(NamedTuple):
    replica_id: str
    rank: int
    idle_s: float
    recording_s: float
    groups: tuple[GroupReport, ...]


class HostReport(NamedTuple):
    host_id: str
    window_collectives: int
    ranks: tuple[RankReport, ...]


class GroupKey(NamedTuple):
    """A communicator as the controller names it (a tuple: the analyzers hash millions)."""

    group: str
    #: an intra-replica group's replica ("" for a cross-replica group)
    replica_id: str
    #: a cross-replica group's rank position (-1 for an intra-replica group)
    rank: int

    def describe(self) -> str:
        if self.replica_id == POOLED:
            return f"group {self.group} (every replica's, pooled)"
        if self.replica_id:
            return f"group {self.group} of replica {self.replica_id}"
        return f"group {self.group} (rank {self.rank} of every replica)"


#: The replica of a pooled key: an intra-replica group's windows judged over every replica's
#: ranks together (replicas do the same work per step; a replica of two ranks is too small to
#: be judged alone).
POOLED = "*"


def pooled_key(group: str) -> GroupKey:
    return _new_tuple(GroupKey, (group, POOLED, -1))


_new_tuple = tuple.__new__


def group_key(replica_id: str, rank: int, g: GroupReport) -> GroupKey:
    # tuple.__new__ directly: the NamedTuple constructor's Python frame costs more than the tuple
    if g.kind >= _FIRST_CROSS:
        return _new_tuple(GroupKey, (g.group, "", rank))
    return _new_tuple(GroupKey, (g.group, replica_id, -1))


def rank_name(key: RankKey) -> str:
    return f"{key[0]}/{key[1]}"


@dataclass(slots=True)
class RankView:
    """The latest report about one rank, anchored at the controller's receive time."""

    host_id: str
    received_at: float
    report: RankReport

    def stale(self, now: float, stale_s: float) -> bool:
        return now - self.received_at > stale_s


def check_report(report: HostReport, max_id_chars: int) -> HostReport:
    """The report, if every field is within its bound; InvalidArgument names the first that is not."""
    check_id("host_id", report.host_id, max_id_chars)
    if not 1 <= report.window_collectives <= MAX_WINDOW_COLLECTIVES:
        raise InvalidArgument(f"window_collectives must be 1..{MAX_WINDOW_COLLECTIVES}, "
                              f"got {report.window_collectives}.")
    if not 1 <= len(report.ranks) <= MAX_RANKS_PER_REPORT:
        raise InvalidArgument(f"a telemetry report carries 1..{MAX_RANKS_PER_REPORT} ranks, got {len(report.ranks)}.")
    seen = set()
    for r in report.ranks:
        where = f"rank {r.replica_id}/{r.rank}"
        check_id("replica_id", r.replica_id, max_id_chars)
        if r.rank < 0 or (r.replica_id, r.rank) in seen:
            raise InvalidArgument(f"{where} is negative or reported twice.")
        seen.add((r.replica_id, r.rank))
        _seconds(where, "idle_s", r.idle_s)
        _seconds(where, "recording_s", r.recording_s)
        _within(where, "idle_s", r.idle_s, "recording_s", r.recording_s)
        if len(r.groups) > MAX_GROUPS_PER_RANK:
            raise InvalidArgument(f"{where} reports {len(r.groups)} groups; the limit is {MAX_GROUPS_PER_RANK}.")
        names = set()
        for g in r.groups:
            _check_group(where, g, r.recording_s)
            if g.group in names:
                raise InvalidArgument(f"{where} reports group {g.group!r} twice.")
            names.add(g.group)
    return report


def _check_group(where: str, g: GroupReport, recording_s: float) -> None:
    """Each field within its bound, and consistent with the others: no age is longer than the
    rank's recording (the ring has seen nothing older), a pending collective has not been idle
    longer than it is pending, and a group with nothing pending reports no pending time or bytes."""
    if not 1 <= len(g.group) <= MAX_GROUP_CHARS or not _GROUP.match(g.group):
        raise InvalidArgument(f"{where}: group {g.group[:40]!r} must be 1..{MAX_GROUP_CHARS} characters of "
                              f"letters, digits and ._:@/+=-.")
    where = f"{where} group {g.group}"
    if not 1 <= g.kind <= MAX_KIND:
        raise InvalidArgument(f"{where}: kind must be 1..{MAX_KIND}, got {g.kind}.")
    if g.size < 1:
        raise InvalidArgument(f"{where}: size must be at least 1, got {g.size}.")
    for name in ("last_joined_seq", "last_done_seq", "pending_seq"):
        if getattr(g, name) < -1:
            raise InvalidArgument(f"{where}: {name} must be -1 or more, got {getattr(g, name)}.")
    if g.last_done_seq > g.last_joined_seq or g.pending_seq > g.last_joined_seq:
        raise InvalidArgument(f"{where}: last_done_seq {g.last_done_seq} and pending_seq {g.pending_seq} cannot be "
                              f"past last_joined_seq {g.last_joined_seq}.")
    for name in ("pending_s", "pending_idle_s"):
        _seconds(where, name, getattr(g, name))
    if g.pending_nbytes < 0 or g.pending_sent_bytes < 0:
        raise InvalidArgument(f"{where}: byte counts must not be negative.")
    _within(where, "pending_s", g.pending_s, "recording_s", recording_s)
    _within(where, "pending_idle_s", g.pending_idle_s, "pending_s", g.pending_s)
    if g.pending_seq == -1 and (g.pending_s or g.pending_idle_s or g.pending_nbytes or g.pending_sent_bytes):
        raise InvalidArgument(f"{where}: pending_seq -1 (nothing pending) with pending_s {g.pending_s}, pending_idle_s "
                              f"{g.pending_idle_s}, pending_nbytes {g.pending_nbytes} and pending_sent_bytes "
                              f"{g.pending_sent_bytes}: all must be 0.")
    if len(g.windows) > MAX_WINDOWS_PER_GROUP:
        raise InvalidArgument(f"{where} carries {len(g.windows)} windows; the limit is {MAX_WINDOWS_PER_GROUP}.")
    for w in g.windows:
        if w.index < 0:
            raise InvalidArgument(f"{where}: window index must not be negative, got {w.index}.")
        _seconds(f"{where} window {w.index}", "own_s", w.own_s)
        _seconds(f"{where} window {w.index}", "wait_s", w.wait_s)
        # (wait_s is not bounded so: collectives in flight together each count their wait)
        _within(f"{where} window {w.index}", "own_s", w.own_s, "recording_s", recording_s)
        if not isinstance(w.disturbed, bool):
            raise InvalidArgument(f"{where} window {w.index}: disturbed must be true or false, got {w.disturbed!r}.")


#: How much longer than its bound an age may be: the readings an age and its bound start from
#: are taken by one trainer on one clock, but not at the same instant.
AGE_SLACK_S = 0.001


def _within(where: str, name: str, value: float, bound_name: str, bound: float) -> None:
    """`name` is a part of `bound_name`'s span: a longer one is a report that contradicts itself
    (beyond AGE_SLACK_S: two clock readings of one trainer, taken a moment apart)."""
    if value > bound + AGE_SLACK_S:
        raise InvalidArgument(f"{where}: {name} {value:g} s is longer than {bound_name} {bound:g} s, the time it "
                              f"is part of.")


def _seconds(where: str, name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgument(f"{where}: {name} must be a finite number of seconds >= 0, got {value}.")
