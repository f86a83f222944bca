"""Stragglers: ranks whose own work before collectives is persistently the slowest. Pure.

For each complete window of a group (collectives with seq in [i·W, (i+1)·W)), every member
reports its *own time*: how long it spent outside collectives before joining them, measured on
its host's clock from its previous collective event. All members of a group do the same work
between the same collectives, so their own times are comparable; a rank that merely waited for
someone else (released late by an earlier collective) joins right after its release and is not
blamed, and hosts' clocks never meet (each value is a difference on one clock).

A member whose window is *disturbed* did work there that its peers need not have done (it wrote
a checkpoint, served or fetched a catch-up, formed a new ring: protos/telemetry_ring.py): its
own time says nothing about its speed, so it is left out of that window, neither flagged nor
counted in the median. A rank that writes every checkpoint is judged in the other windows.

A window flags a member whose own time exceeds the group median by more than
`straggler_mad_k` robust standard deviations (1.4826 × MAD) and by more than
`straggler_min_excess` of the median. A window that flags more than a quarter of its members
shows a group-wide change (a new phase of training, a shared slowdown), not a straggler, and
counts for nobody. A rank flagged in `straggler_windows` of its last `straggler_of_windows`
windows of a group is a straggler: one slow window (a GC pause, a one-off slow collective) is
not enough. Groups of fewer than 3 members are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from controller.core.diagnosis.findings import Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import GroupKey, RankKey, rank_name

MIN_MEMBERS = 3
MAD_TO_SIGMA = 1.4826
#: Open windows kept per group; the oldest is judged early to make room.
MAX_OPEN_PER_GROUP = 8
#: Confidence in a straggler finding.
CONFIDENCE = 0.9


@dataclass(frozen=True)
class Flag:
    rank: RankKey
    host_id: str
    own_s: float
    ratio: float
    z: float


@dataclass(frozen=True)
class WindowVerdict:
    key: GroupKey
    index: int
    #: the members judged (reported and not disturbed)
    members: int
    median_s: float
    threshold_s: float
    flags: tuple[Flag, ...]
    #: too many members flagged: a group-wide change, counted for nobody
    noisy: bool
    #: members left out: their window was disturbed
    left_out: tuple[RankKey, ...] = ()


def judge_window(key: GroupKey, index: int, own: dict[RankKey, float], hosts: dict[RankKey, str],
                 settings: DiagnosisSettings, disturbed: frozenset[RankKey] | set[RankKey] = frozenset()
                 ) -> WindowVerdict:
    """Which members of one window spent far longer on their own than the group (the
    `disturbed` members left out)."""
    left_out = tuple(sorted(rk for rk in own if rk in disturbed)) if disturbed else ()
    if left_out:
        own = {rk: v for rk, v in own.items() if rk not in disturbed}
    values = list(own.values())
    if len(values) < MIN_MEMBERS:
        return WindowVerdict(key, index, len(values), median(values) if values else 0.0, float("inf"), (), False,
                             left_out)
    med = median(values)
    sigma = MAD_TO_SIGMA * median([abs(v - med) for v in values])
    threshold = med + max(settings.straggler_mad_k * sigma, settings.straggler_min_excess * med)
    flags = tuple(
        Flag(rk, hosts.get(rk, ""), v, v / med if med > 0 else float("inf"), (v - med) / sigma if sigma > 0 else float("inf"))
        for rk, v in sorted((rk, v) for rk, v in own.items() if v > threshold))
    noisy = len(flags) > max(1, len(values) // 4)
    return WindowVerdict(key, index, len(values), med, threshold, flags, noisy, left_out)


@dataclass
class _Open:
    first_at: float
    size: int
    own: dict[RankKey, float] = field(default_factory=dict)
    hosts: dict[RankKey, str] = field(default_factory=dict)
    disturbed: set[RankKey] = field(default_factory=set)


class StragglerWindows:
    """Open windows per group, judged once every member reported or after `straggler_window_wait_s`."""

    def __init__(self, settings: DiagnosisSettings) -> None:
        self.settings = settings
        self._open: dict[GroupKey, dict[int, _Open]] = {}
        self._judged_upto: dict[GroupKey, int] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._open.values())

    def add(self, key: GroupKey, index: int, size: int, rank: RankKey, host_id: str, own_s: float,
            now: float, disturbed: bool = False) -> list[WindowVerdict]:
        """One member's window (`disturbed`: left out of the judgement, still counted as
        reported); returns the verdicts it completed (or pushed out)."""
        if index <= self._judged_upto.get(key, -1):
            return []  # judged already: too late to change it
        windows = self._open.get(key)
        if windows is None:
            windows = self._open[key] = {}
        w = windows.get(index)
        if w is None:
            w = windows[index] = _Open(now, size)
        elif size > w.size:
            w.size = size
        w.own[rank] = own_s
        w.hosts[rank] = host_id
        if disturbed:
            w.disturbed.add(rank)
        else:
            w.disturbed.discard(rank)
        if len(w.own) < w.size and len(windows) <= MAX_OPEN_PER_GROUP:
            return []
        out = [self._judge(key, index)] if len(w.own) >= w.size else []
        while key in self._open and len(self._open[key]) > MAX_OPEN_PER_GROUP:
            out.append(self._judge(key, min(self._open[key])))
        return out

    def due(self, now: float) -> list[WindowVerdict]:
        """Judge the windows that waited long enough for their missing members."""
        wait = self.settings.straggler_window_wait_s
        late = [(key, i) for key, ws in self._open.items() for i, w in ws.items() if now - w.first_at >= wait]
        return [self._judge(key, i) for key, i in late]

    def forget(self, predicate) -> None:
        """Drop the open windows of the groups `predicate(key)` names (a replica that restarted)."""
        for key in [k for k in self._open if predicate(k)]:
            del self._open[key]

    def _judge(self, key: GroupKey, index: int) -> WindowVerdict:
        w = self._open[key].pop(index)
        if not self._open[key]:
            del self._open[key]
        self._judged_upto[key] = max(self._judged_upto.get(key, -1), index)
        return judge_window(key, index, w.own, w.hosts, self.settings, w.disturbed)


class StragglerTracker:
    """Per group, the ranks flagged in recent windows; a finding once one is flagged persistently."""

    def __init__(self, settings: DiagnosisSettings) -> None:
        self.settings = settings
        self._flags: dict[GroupKey, dict[RankKey, list[tuple[int, Flag]]]] = {}
        self._latest: dict[GroupKey, int] = {}
        #: (rank, group) -> the window its reported episode started in
        self._reported: dict[tuple[RankKey, GroupKey], int] = {}

    def observe(self, v: WindowVerdict, now: float) -> list[Finding]:
        s = self.settings
        latest = self._latest[v.key] = max(self._latest.get(v.key, -1), v.index)
        flagged = self._flags.setdefault(v.key, {})
        if not v.noisy:
            for f in v.flags:
                flagged.setdefault(f.rank, []).append((v.index, f))
        out = []
        for rank in list(flagged):
            recent = [(i, f) for i, f in flagged[rank] if i > latest - s.straggler_of_windows]
            if not recent:
                del flagged[rank]
                self._reported.pop((rank, v.key), None)  # the episode is over
                continue
            flagged[rank] = recent
            if len(recent) >= s.straggler_windows and (rank, v.key) not in self._reported:
                self._reported[(rank, v.key)] = recent[0][0]
                out.append(self._finding(rank, v, recent, now))
        if not flagged:
            del self._flags[v.key]
        return out

    def forget_replica(self, replica_id: str) -> None:
        """A replica restarted (or moved): its ranks' flags were about processes that are gone."""
        for key in list(self._flags):
            flagged = self._flags[key]
            for rank in [r for r in flagged if r[0] == replica_id]:
                del flagged[rank]
            if not flagged:
                del self._flags[key]
        for rank, key in [k for k in self._reported if k[0][0] == replica_id]:
            del self._reported[(rank, key)]

    def _finding(self, rank: RankKey, v: WindowVerdict, recent: list[tuple[int, Flag]], now: float) -> Finding:
        s = self.settings
        flags = [f for _, f in recent]
        ratio = median(f.ratio for f in flags)
        host = flags[-1].host_id
        windows = [i for i, _ in recent]
        evidence = (
            f"own time before joining collectives was {ratio:.2f}x the median of {v.key.describe()} "
            f"({v.members} members) in {len(recent)} of its last {s.straggler_of_windows} windows "
            f"(windows {windows[0]}..{windows[-1]})",
            f"last window {v.index}: median {v.median_s:.4f} s, flagged above {v.threshold_s:.4f} s; "
            f"rank {rank_name(rank)} {flags[-1].own_s:.4f} s (robust z {min(flags[-1].z, 1e6):.1f})",
            "own time is measured on the rank's host clock from its previous collective event, so ranks that only "
            "waited for this one are not blamed and clock skew between hosts does not enter",
        )
        return Finding(FindingKind.STRAGGLER, f"straggler:{rank_name(rank)}:{v.key.describe()}:w{windows[0]}", now,
                       (host,) if host else (), CONFIDENCE,
                       f"rank {rank_name(rank)} on host {host} is a straggler: {ratio:.2f}x its group's own time "
                       f"in {len(recent)} of {s.straggler_of_windows} windows",
                       evidence, (rank_name(rank),), len(recent))
