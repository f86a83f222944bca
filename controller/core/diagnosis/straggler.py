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
`straggler_min_excess` of the median and by more than `straggler_min_excess_s` (own times of
FTAR groups are under a millisecond, and their jitter is not a straggler). A window that flags
more than a quarter of its members shows a group-wide change (a new phase of training, a shared
slowdown), not a straggler, and counts for nobody.

A rank is a straggler in a group when it was flagged in at least the fraction
`straggler_windows / straggler_of_windows` of the group's judged windows, and in at least
`straggler_windows` of them, over the longer of its last `straggler_of_windows` windows and the
windows judged in the last `straggler_min_span_s` seconds (back to the last judging at or
before the span began: agents report windows in batches, every few seconds); and the group has
been judged for that long. One slow window (a GC pause, a one-off slow collective) is not
enough, and neither are a few at fast steps: at 0.1 s steps 3 of 5 windows are half a second,
which a loaded host's scattered noise reaches now and then, while 31 of 51 need a rank slow for
seconds. At steps of span / (straggler_of_windows - 1) or longer (1.25 s by default) the window
count governs, as it did alone. A window the rank was left out of (disturbed, not reported)
counts as one it was not flagged in; a window too few members were judged in counts for nobody.
Memory: per group the judged windows the evidence needs, at most MAX_JUDGED_PER_GROUP, and per
rank its flags in them. Groups of fewer than 3 members are not judged.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from statistics import median

from controller.core.diagnosis.findings import Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import GroupKey, RankKey, rank_name

MIN_MEMBERS = 3
MAD_TO_SIGMA = 1.4826
#: Open windows kept per group; the oldest is judged early to make room.
MAX_OPEN_PER_GROUP = 8
#: Judged windows remembered per group (index and time, and the flags of its ranks in them):
#: the time rule's evidence is at most this many windows (51 s of 0.1 s steps).
MAX_JUDGED_PER_GROUP = 512
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
    threshold = med + max(settings.straggler_mad_k * sigma, settings.straggler_min_excess * med,
                          settings.straggler_min_excess_s)
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


@dataclass
class _Record:
    """A group's judged windows and its ranks' flags in them."""
    #: when its first window was judged
    since: float
    #: (index, when judged), by index: the longer of the last `straggler_of_windows` and those
    #: judged in the last `straggler_min_span_s`, at most MAX_JUDGED_PER_GROUP
    judged: list[tuple[int, float]] = field(default_factory=list)
    #: rank -> window index -> its flag there (only windows still in `judged`)
    flags: dict[RankKey, dict[int, Flag]] = field(default_factory=dict)


def _span_start(judged: list[tuple[int, float]], cut: float) -> float:
    """When the time rule's evidence begins: the last judging at or before `cut`, so that the
    evidence covers the whole span even when windows come in batches (an agent reports every
    few seconds); -inf when the record is younger than the span."""
    return max((at for _, at in judged if at <= cut), default=float("-inf"))


class StragglerTracker:
    """Per group, the windows judged lately and the ranks flagged in them; a finding once one is
    flagged persistently, in windows and in time."""

    def __init__(self, settings: DiagnosisSettings) -> None:
        self.settings = settings
        self._groups: dict[GroupKey, _Record] = {}
        #: (rank, group) -> the window its reported episode started in
        self._reported: dict[tuple[RankKey, GroupKey], int] = {}

    def kept(self) -> tuple[int, int]:
        """What is remembered: judged windows, and flags, over all groups."""
        return (sum(len(r.judged) for r in self._groups.values()),
                sum(len(f) for r in self._groups.values() for f in r.flags.values()))

    def observe(self, v: WindowVerdict, now: float) -> list[Finding]:
        s = self.settings
        if v.members < MIN_MEMBERS:
            return []  # nobody was judged there (too few reported, or all disturbed): no evidence either way
        rec = self._groups.get(v.key)
        if rec is None:
            rec = self._groups[v.key] = _Record(now)
        insort(rec.judged, (v.index, now))
        if not v.noisy:  # a group-wide change counts for nobody (the window still counts)
            for f in v.flags:
                rec.flags.setdefault(f.rank, {})[v.index] = f
        self._prune(rec, now)
        if not rec.flags:
            return []
        evidence = self._evidence(rec, now)
        in_evidence = {i for i, _ in evidence}
        long_enough = now - rec.since >= s.straggler_min_span_s
        out = []
        for rank, flags in list(rec.flags.items()):
            hits = sorted(i for i in flags if i in in_evidence)
            if not hits:
                del rec.flags[rank]
                self._reported.pop((rank, v.key), None)  # the episode is over
                continue
            persistent = (len(hits) >= s.straggler_windows
                          and len(hits) * s.straggler_of_windows >= s.straggler_windows * len(evidence))
            if persistent and long_enough and (rank, v.key) not in self._reported:
                self._reported[(rank, v.key)] = hits[0]
                out.append(self._finding(rank, v, [flags[i] for i in hits], hits, evidence, now))
        return out

    def _evidence(self, rec: _Record, now: float) -> list[tuple[int, float]]:
        """The longer of the group's last `straggler_of_windows` windows and those judged in
        the last `straggler_min_span_s` (the window count wins a tie)."""
        by_count = rec.judged[-self.settings.straggler_of_windows:]
        start = _span_start(rec.judged, now - self.settings.straggler_min_span_s)
        by_time = [w for w in rec.judged if w[1] >= start]
        return by_time if len(by_time) > len(by_count) else by_count

    def _prune(self, rec: _Record, now: float) -> None:
        """Keep the windows the evidence may need (a suffix by index), at most
        MAX_JUDGED_PER_GROUP, and the flags in them."""
        judged = rec.judged
        start_at = _span_start(judged, now - self.settings.straggler_min_span_s)
        keep = max(len(judged) - self.settings.straggler_of_windows, 0)
        keep = min(keep, next((n for n, w in enumerate(judged) if w[1] >= start_at), keep))
        keep = max(keep, len(judged) - MAX_JUDGED_PER_GROUP)
        if keep <= 0:
            return
        del judged[:keep]
        lowest = judged[0][0]
        for rank, flags in rec.flags.items():
            if min(flags) < lowest:
                rec.flags[rank] = {i: f for i, f in flags.items() if i >= lowest}

    def forget_replica(self, replica_id: str) -> None:
        """A replica restarted (or moved): its ranks' flags were about processes that are gone
        (and its own groups' records with them)."""
        for key in list(self._groups):
            if key.replica_id == replica_id:
                del self._groups[key]
                continue
            flags = self._groups[key].flags
            for rank in [r for r in flags if r[0] == replica_id]:
                del flags[rank]
        for rank, key in [k for k in self._reported if k[0][0] == replica_id or k[1].replica_id == replica_id]:
            del self._reported[(rank, key)]

    def _finding(self, rank: RankKey, v: WindowVerdict, flags: list[Flag], hits: list[int],
                 evidence: list[tuple[int, float]], now: float) -> Finding:
        ratio = median(f.ratio for f in flags)
        host = flags[-1].host_id
        span_s = now - min(at for _, at in evidence)
        evidence_text = (
            f"own time before joining collectives was {ratio:.2f}x the median of {v.key.describe()} "
            f"({v.members} members) in {len(hits)} of its last {len(evidence)} windows "
            f"(windows {hits[0]}..{hits[-1]}, judged over {span_s:.1f} s)",
            f"last window {v.index}: median {v.median_s:.4f} s, flagged above {v.threshold_s:.4f} s; "
            f"rank {rank_name(rank)} {flags[-1].own_s:.4f} s (robust z {min(flags[-1].z, 1e6):.1f})",
            "own time is measured on the rank's host clock from its previous collective event, so ranks that only "
            "waited for this one are not blamed and clock skew between hosts does not enter",
        )
        return Finding(FindingKind.STRAGGLER, f"straggler:{rank_name(rank)}:{v.key.describe()}:w{hits[0]}", now,
                       (host,) if host else (), CONFIDENCE,
                       f"rank {rank_name(rank)} on host {host} is a straggler: {ratio:.2f}x its group's own time "
                       f"in {len(hits)} of {len(evidence)} windows",
                       evidence_text, (rank_name(rank),), len(hits))
