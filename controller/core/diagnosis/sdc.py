"""Silent data corruption: digest disagreements attributed to hosts, tracked over time. Pure.

Replicas that committed the same step hold bitwise-identical state, and so does rank k of
every replica (each holds the same shard). A coordinator that reports its replica digest may also
send one digest per rank (`ReportStepRequest.rank_digests`). When a step's replica digests
disagree (`controller.core.digests`), each replica outside the reference is compared rank by
rank with the other replicas (per rank, the most common digest among them): the ranks that
differ name their hosts. Without rank digests every host of the replica is a candidate.

A host is an SDC suspect when it is in the minority repeatedly: each incident is a finding,
and the policy evicts once a host has `sdc_evict_after` incidents within `sdc_window_s`. A
mismatch spread over more than `sdc_max_hosts` hosts looks like a software divergence (a
bug, non-deterministic kernels) and names nobody. With only two replicas (a tie) both sides
are suspects: a third replica is what tells them apart.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Mapping

from controller.core.digests import Verdict
from controller.core.diagnosis.findings import Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.errors import InvalidArgument

MIN_RANK_DIGEST_CHARS, MAX_RANK_DIGEST_CHARS = 8, 32
_HEX = re.compile(r"^[0-9a-f]+$")
#: Incidents remembered per host (beyond this, the oldest are dropped).
MAX_INCIDENTS_PER_HOST = 64
#: Confidence in an attribution by rank digests to one host.
CONFIDENT = 0.95

HostOf = Callable[[str, int], "str | None"]
HostsOf = Callable[[str], "list[str]"]


def check_rank_digests(digests, world_size: int) -> tuple[str, ...]:
    """The rank digests in lower case (or () when none were sent); InvalidArgument names a bad one."""
    digests = tuple(digests)
    if not digests:
        return ()
    if len(digests) != world_size:
        raise InvalidArgument(f"rank_digests has {len(digests)} entries but the replica has {world_size} ranks; "
                              f"send one per rank or none.")
    out = []
    for k, d in enumerate(digests):
        low = d.lower()
        if not MIN_RANK_DIGEST_CHARS <= len(low) <= MAX_RANK_DIGEST_CHARS or not _HEX.match(low):
            raise InvalidArgument(f"rank_digests[{k}] {d[:40]!r} must be {MIN_RANK_DIGEST_CHARS}.."
                                  f"{MAX_RANK_DIGEST_CHARS} hex digits.")
        out.append(low)
    return tuple(out)


@dataclass(frozen=True)
class Incident:
    step: int
    replica_id: str
    #: ranks whose digest differs from the other replicas' (empty: no rank digests to compare)
    ranks: tuple[int, ...]
    #: their hosts, most differing ranks first
    hosts: tuple[str, ...]
    #: the verdict had no majority: the reference side may be the corrupt one
    tie: bool


def attribute(verdict: Verdict, rank_digests: Mapping[str, tuple[str, ...]], host_of: HostOf,
              hosts_of: HostsOf) -> list[Incident]:
    """One incident per replica outside the reference (both sides on a tie)."""
    sides = set(verdict.diverged)
    if verdict.tie:
        sides |= set(dict(verdict.groups)[verdict.reference])
    reporters = {r for _, ids in verdict.groups for r in ids}
    out = []
    for rid in sorted(sides):
        mine = rank_digests.get(rid)
        others = [d for r, d in rank_digests.items() if r != rid and r in reporters and len(d) == len(mine or ())]
        if not mine or not others:
            out.append(Incident(verdict.step, rid, (), tuple(sorted(hosts_of(rid))), verdict.tie))
            continue
        ranks = tuple(k for k, d in enumerate(mine) if d != Counter(o[k] for o in others).most_common(1)[0][0])
        per_host = Counter(h for h in (host_of(rid, k) for k in ranks) if h)
        out.append(Incident(verdict.step, rid, ranks, tuple(h for h, _ in per_host.most_common()), verdict.tie))
    return out


class SdcTracker:
    """Incidents per host over the last `sdc_window_s`; a finding per incident."""

    def __init__(self, settings: DiagnosisSettings) -> None:
        self.settings = settings
        self._incidents: dict[str, deque[float]] = {}

    def incidents(self, host_id: str, now: float) -> int:
        times = self._incidents.get(host_id)
        return sum(1 for t in times if now - t <= self.settings.sdc_window_s) if times else 0

    def observe(self, incident: Incident, now: float) -> Finding:
        s = self.settings
        spread = len(incident.hosts) > s.sdc_max_hosts
        if not spread:
            for h in incident.hosts:
                self._incidents.setdefault(h, deque(maxlen=MAX_INCIDENTS_PER_HOST)).append(now)
        hosts = sorted(incident.hosts, key=lambda h: (-self.incidents(h, now), incident.hosts.index(h)))
        where = (f"ranks {', '.join(map(str, incident.ranks[:8]))}{'…' if len(incident.ranks) > 8 else ''}"
                 if incident.ranks else "no rank digests to compare")
        evidence = [f"replica {incident.replica_id}'s digest at step {incident.step} is outside the reference; "
                    f"differing: {where}"]
        if spread:
            confidence = 0.0
            summary = (f"replica {incident.replica_id} differs at step {incident.step} on {len(incident.ranks)} "
                       f"rank(s) over {len(incident.hosts)} hosts: a software divergence, not one host")
        else:
            confidence = (CONFIDENT if incident.ranks else 1.0) / max(len(hosts), 1) * (0.5 if incident.tie else 1.0)
            for h in hosts[:4]:
                evidence.append(f"host {h}: {self.incidents(h, now)} digest-minority incident(s) in the last "
                                f"{s.sdc_window_s:g} s")
            if incident.tie:
                evidence.append("no majority among the digests: either side may be corrupt (a third replica decides)")
            summary = (f"host {hosts[0] if hosts else '?'} holds replica {incident.replica_id}'s differing state at "
                       f"step {incident.step} ({where})")
        count = self.incidents(hosts[0], now) if hosts and not spread else 0
        return Finding(FindingKind.SDC, f"sdc:{incident.replica_id}:step{incident.step}", now, tuple(hosts),
                       round(confidence, 3), summary, tuple(evidence),
                       tuple(f"{incident.replica_id}/{k}" for k in incident.ranks[:16]), count)
