"""The diagnosis' memory: telemetry per rank, straggler windows, SDC incidents, findings. Pure.

It knows nothing of hosts' assignments or replicas' states: the caller passes what it needs
(which ranks a host may report, who should be in a group, which host holds a rank) and acts
on the findings (`controller.core.diagnosis.acting`). Every structure is bounded: one view
per rank a live host runs, a few open windows per group, rank digests of the last
`digest_steps` steps, `recent_findings` findings.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, NamedTuple

from controller.core.digests import Verdict
from controller.core.diagnosis.ages import AGE_SLACK_S, plausible
from controller.core.diagnosis.findings import ActionKind, Entry, Finding, FindingKind, FindingLog
from controller.core.diagnosis.hang import Excused, HostOf, MembersOf, find_hangs
from controller.core.diagnosis.sdc import SdcTracker, attribute
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.straggler import StragglerTracker, StragglerWindows, WindowVerdict
from controller.core.diagnosis.telemetry import HostReport, RankKey, RankView, group_key, pooled_key, rank_name

#: Evictions remembered for the hourly budget.
MAX_EVICTIONS_KEPT = 256
#: A hang already reported is reported again when its confidence grew by this much.
REPORT_AGAIN_CONFIDENCE = 0.2
#: Decisions a hang's later evidence may change (not logged yet, reported only, held by a limit).
UNDECIDED = (None, ActionKind.REPORT, ActionKind.HOLD)


class Reported(NamedTuple):
    """A hang finding in force, as it was last decided."""

    #: its first host (the suspect)
    host: tuple[str, ...]
    confidence: float
    #: what the evidence rule (policy rule 1b) weighed: the suspect's own telemetry, and how
    #: many other hosts' telemetry shows it
    support: tuple[bool, int]
    #: the log entry it was decided in, and how (None until the caller logs it)
    entry_id: int | None = None
    action: ActionKind | None = None


def support(f: Finding) -> tuple[bool, int]:
    """The evidence a finding rests on: (its suspect's own telemetry shows it, other witnesses)."""
    return f.own_evidence, len(set(f.witnesses) - set(f.hosts[:1]))


def stronger(now: tuple[bool, int], before: tuple[bool, int]) -> bool:
    """More evidence than before: own telemetry where there was none, or more other witnesses."""
    return (now[0] and not before[0]) or now[1] > before[1]


class Diagnosis:
    def __init__(self, settings: DiagnosisSettings, digest_steps: int) -> None:
        self.settings = settings
        self.ranks: dict[RankKey, RankView] = {}
        #: the window length every agent of the job uses (the first report's; others' windows are ignored)
        self.window_collectives: int | None = None
        self.windows = StragglerWindows(settings)
        self.stragglers = StragglerTracker(settings)
        self.sdc = SdcTracker(settings)
        self.log = FindingLog(settings.recent_findings)
        self.digest_steps = digest_steps
        self.rank_digests: dict[int, dict[str, tuple[str, ...]]] = {}
        #: step -> replica -> the host of each of its ranks when it reported that step's digest
        #: (a verdict decided after a swap is about the hosts that held the state, not today's)
        self.digest_hosts: dict[int, dict[str, tuple[str | None, ...]]] = {}
        #: replica -> when the controller last declared it dead (its ranks' holders since are new)
        self.died_at: dict[str, float] = {}
        #: rank -> when the process the controller forgot at its replica's death began (on the
        #: controller's clock): a later report of that process (one in flight at the death, or
        #: read while it stopped) is its predecessor's word, never the new process's
        self.gone_began: dict[RankKey, float] = {}
        #: hang findings now in force, by key, as last decided
        self.active_hangs: dict[str, Reported] = {}
        self.next_analysis_at: float | None = None
        self.evictions_at: deque[float] = deque(maxlen=MAX_EVICTIONS_KEPT)
        #: held findings (log entry id -> when first held), decided again until hold_s passed
        self.held: dict[int, float] = {}
        self.reports = 0
        #: per intra-replica group name, the ranks whose windows are pooled (a window is complete
        #: once every one of them reported it)
        self._pools: dict[str, set[RankKey]] = {}

    def ingest(self, report: HostReport, now: float, accept: Callable[[RankKey], bool],
               pool_size: int | None = None) -> tuple[list[Finding], list[str]]:
        """Keep a checked report's ranks (those `accept` allows); straggler findings it completed,
        and the ranks left out with why. `pool_size`: how many ranks the job runs (a pooled
        window is complete when that many reported it; default: the ranks seen so far)."""
        self.reports += 1
        ignored, verdicts = [], []
        if self.window_collectives is None:
            self.window_collectives = report.window_collectives
        windows_ok = report.window_collectives == self.window_collectives
        if not windows_ok:
            ignored.append(f"windows of {report.window_collectives} collectives ignored: the job's agents use "
                           f"{self.window_collectives}")
        for r in report.ranks:
            rk = (r.replica_id, r.rank)
            if not accept(rk):
                ignored.append(f"rank {rank_name(rk)}: host {report.host_id} does not run it")
                continue
            if self._predecessor(rk, now - r.recording_s):
                ignored.append(f"rank {rank_name(rk)}: this telemetry is of the process that ran it before replica "
                               f"{rk[0]} died or restarted (its recording began {r.recording_s:.1f} s ago); ignored")
                continue
            r, cut = plausible(r, self.ranks.get(rk), report.host_id, now)
            ignored += cut
            self.ranks[rk] = RankView(report.host_id, now, r)
            if windows_ok:
                for g in r.groups:
                    if not g.windows:
                        continue
                    if g.cross_replica:
                        key, size = group_key(r.replica_id, r.rank, g), g.size
                    else:  # intra-replica windows are judged over every replica's ranks at once
                        members = self._pools.setdefault(g.group, set())
                        members.add(rk)
                        key, size = pooled_key(g.group), max(pool_size or 0, len(members))
                    for w in g.windows:
                        verdicts += self.windows.add(key, w.index, size, rk, report.host_id, w.own_s, now,
                                                     w.disturbed)
        return self._stragglers(verdicts, now), ignored

    def _predecessor(self, rk: RankKey, began: float) -> bool:
        """Whether a report whose process began at `began` is of the process forgotten at its
        replica's death (or an older one); a younger process's report clears the mark."""
        gone = self.gone_began.get(rk)
        if gone is None:
            return False
        if began <= gone + AGE_SLACK_S:
            return True
        del self.gone_began[rk]
        return False

    def due(self, now: float) -> bool:
        if self.next_analysis_at is not None and now < self.next_analysis_at:
            return False
        self.next_analysis_at = now + self.settings.analysis_interval_s
        return True

    def analyze(self, now: float, members_of: MembersOf, host_of: HostOf, excused: Excused) -> list[Finding]:
        """New findings: windows that waited long enough, hangs not reported yet, and hangs
        whose evidence grew since they were decided (`redecides` names the entry to decide again)."""
        out = self._stragglers(self.windows.due(now), now)
        hangs = find_hangs(self.ranks, now, self.settings, members_of, host_of, excused, self.died_at)
        active: dict[str, Reported] = {}
        for f in hangs:
            before = self.active_hangs.get(f.key)
            if self._news(f, before):
                out.append(f)
                # the same suspect with more evidence is decided again in its entry; a new
                # suspect (or a much surer one) is a new entry
                same = before is not None and before.host == f.hosts[:1] and \
                    f.confidence < before.confidence + REPORT_AGAIN_CONFIDENCE
                active[f.key] = Reported(f.hosts[:1], f.confidence, support(f),
                                         *((before.entry_id, before.action) if same else ()))
            else:
                active[f.key] = before._replace(confidence=f.confidence)
        self.active_hangs = active
        return out

    @staticmethod
    def _news(f: Finding, before: Reported | None) -> bool:
        """A hang not reported yet, one whose suspect changed or became much surer (peers that
        timed out of a stuck collective leave the rank that never progresses alone), or one
        with more evidence than it was decided with (the suspect's own telemetry, read late)."""
        return before is None or before.host != f.hosts[:1] or \
            f.confidence >= before.confidence + REPORT_AGAIN_CONFIDENCE or \
            (before.action in UNDECIDED and stronger(support(f), before.support))

    def redecides(self, f: Finding) -> int | None:
        """The log entry `f` decides again (a hang decided before on less evidence), if any."""
        seen = self.active_hangs.get(f.key) if f.kind == FindingKind.HANG else None
        return seen.entry_id if seen is not None and seen.host == f.hosts[:1] else None

    def logged(self, f: Finding, entry: Entry) -> None:
        """`f` was decided in `entry` (a hang reported or held there is decided there again on
        more evidence; one evicted, or dry-run, is done)."""
        seen = self.active_hangs.get(f.key) if f.kind == FindingKind.HANG else None
        if seen is not None and seen.host == f.hosts[:1]:
            self.active_hangs[f.key] = seen._replace(entry_id=entry.id, action=entry.decision.action)

    def keep_rank_digests(self, replica_id: str, step: int, digests: tuple[str, ...],
                          hosts: tuple[str | None, ...] = ()) -> None:
        """A replica's digest of `step`: its rank digests (if sent) and its ranks' hosts now."""
        for kept, value in ((self.rank_digests, digests), (self.digest_hosts, hosts)):
            if not value:
                continue
            kept.setdefault(step, {})[replica_id] = value
            for old in sorted(kept)[: max(len(kept) - self.digest_steps, 0)]:
                del kept[old]

    def incidents(self, verdict: Verdict, host_of: Callable[[str, int], str | None],
                  hosts_of: Callable[[str], list[str]], now: float) -> list[Finding]:
        """SDC findings for one mismatching verdict, naming the hosts that held each replica
        when it reported the step (`host_of`/`hosts_of`, today's holders, when not recorded)."""
        held = self.digest_hosts.get(verdict.step, {})

        def host_then(rid: str, rank: int) -> str | None:
            hosts = held.get(rid)
            return hosts[rank] if hosts and rank < len(hosts) else host_of(rid, rank)

        def hosts_then(rid: str) -> list[str]:
            hosts = held.get(rid)
            return sorted({h for h in hosts if h}) if hosts else hosts_of(rid)
        found = attribute(verdict, self.rank_digests.get(verdict.step, {}), host_then, hosts_then)
        return [self.sdc.observe(i, now) for i in found]

    def forget_replica(self, replica_id: str, now: float) -> None:
        """A replica died (at `now`) or restarted: what its ranks said no longer holds (their
        groups form anew), and a collective that began before its death waits on nobody there."""
        self.died_at[replica_id] = now
        for rk in [rk for rk in self.ranks if rk[0] == replica_id]:
            v = self.ranks.pop(rk)
            self.gone_began[rk] = max(self.gone_began.get(rk, -math.inf), v.received_at - v.report.recording_s)
        for members in self._pools.values():
            members.difference_update([rk for rk in members if rk[0] == replica_id])
        self.windows.forget(lambda key: key.replica_id == replica_id)
        self.stragglers.forget_replica(replica_id)

    def forget_host(self, host_id: str) -> None:
        """A host's agent is gone or its work moved: its telemetry is not about anyone now."""
        gone = [rk for rk, v in self.ranks.items() if v.host_id == host_id]
        for rk in gone:
            del self.ranks[rk]
        for members in self._pools.values():
            members.difference_update(gone)

    def _stragglers(self, verdicts: list[WindowVerdict], now: float) -> list[Finding]:
        return [f for v in verdicts for f in self.stragglers.observe(v, now)]
