"""Hangs: the wait-for graph over collectives, its leaves, and the ranks inside them. Pure.

A collective is *stuck* when some member joined it at least `hang_after_s` ago and it is not
done. The graph: a stuck collective waits for each member that has not joined it; such a
member that is itself stuck in another collective waits for that one. The job is blocked on
the *leaves*: stuck collectives that wait on a member who is stuck nowhere (it never joined:
its process is hung outside collectives, dead, or its host went silent), or on nobody at all
(every member joined, and it still does not complete: somebody joined without progress).

Inside a leaf:
  * members that never joined are the suspects: those whose report (newer than the first
    join) says so first, ordered by how long they have been idle; then members whose
    telemetry is older than the first join or missing (silent: maybe joined since, maybe dead);
  * with every member joined, the suspect is the member that sent the fewest bytes (in a ring
    everyone else moves at least one chunk further before starving); among equals, the one
    that has not moved for longest.
Leaves whose suspects share a host are one finding. Stuck collectives that reach no leaf wait
in a cycle (a mismatched order of collectives): one finding names them, with low confidence.

A stuck collective that waits on a member the controller already knows is down (`excused`:
its replica died or is being rebuilt), on a member whose replica the controller declared dead
after the collective began (`died_at`: whoever holds that rank now -- a spare, a restarted
trainer -- cannot be in it, and the failure was already acted on), or on a process that
started after the collective did (a restarted trainer forms its groups anew), is explained and names
nobody; so is one whose missing members nobody can name (the group's size says someone is
missing, but not who: heartbeats find dead hosts), and one with a member still *starting* (it
has completed no collective since its telemetry began less than `startup_grace_s` ago: its
first collective waits on connections and a loaded host's start-up; past the grace a rank that
hangs while starting is judged like any other), and one awaiting a rank not heard from since
its replica died or restarted less than `startup_grace_s` ago (its new process has not been
read yet; what its predecessor said was forgotten at the death and is never taken again).

Times: a report's ages are measured on its host's clock and anchored at the controller's
receive time, so only differences measured on one host are ever compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple

from controller.core.diagnosis.findings import Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import GroupKey, GroupReport, RankKey, RankView, group_key, rank_name

#: Who should be in a group of `size` members, when the controller knows (None: only reporters).
MembersOf = Callable[[GroupKey, int], Iterable[RankKey] | None]
HostOf = Callable[[RankKey], str | None]
Excused = Callable[[RankKey], bool]
#: Confidence in a suspect named by its own report, by silence only, by least progress, and
#: in the ranks at the oldest collective of a cycle.
CONFIDENT, SILENT_ONLY, LEAST_PROGRESS, IN_A_CYCLE = 0.95, 0.7, 0.9, 0.3
#: Findings one analysis makes at most (the largest clusters of stuck collectives first).
MAX_FINDINGS = 8


class Collective(NamedTuple):
    key: GroupKey
    seq: int

    def describe(self) -> str:
        return f"collective #{self.seq} of {self.key.describe()}"


@dataclass
class _Stuck:
    """What the graph knows about one stuck collective."""

    first_join: float
    kind: str
    size: int = 0
    joined: int = 0
    in_flight: list[tuple[RankKey, GroupReport]] | None = None
    #: members it waits on: (rank, said so after the first join)
    waits_on: list[tuple[RankKey, bool]] | None = None
    #: it waits on someone known to be down, restarted, or nameless: no finding
    explained: bool = False


def find_hangs(ranks: Mapping[RankKey, RankView], now: float, settings: DiagnosisSettings,
               members_of: MembersOf | None = None, host_of: HostOf | None = None,
               excused: Excused | None = None, died_at: Mapping[str, float] | None = None) -> list[Finding]:
    """Findings for every leaf the job is blocked on (empty when nothing is stuck)."""
    starting = _starting(ranks, now, settings.startup_grace_s)
    stuck, blocked = _stuck(ranks, now, settings.hang_after_s, starting)
    if not stuck:
        return []
    died_at = died_at or {}
    restarting = frozenset(rid for rid, t in died_at.items() if now - t < settings.startup_grace_s)
    _members(stuck, ranks, now, members_of, excused or (lambda rk: False), died_at, starting, restarting)
    host = _host_lookup(ranks, host_of)
    leaves: list[tuple[Collective, list[RankKey]]] = []
    for c in sorted(stuck, key=lambda c: stuck[c].first_join):
        s = stuck[c]
        if s.explained:
            continue
        culprits = [(rk, said) for rk, said in s.waits_on if rk not in blocked]
        if culprits:
            leaves.append((c, [rk for rk, _ in _order(culprits, ranks, now)]))
        elif not s.waits_on:
            leaves.append((c, list(_progress_suspects(s.in_flight))))
    clusters = _by_host(leaves, host)
    out = [_finding(cs, suspects_of, stuck, ranks, host, now, settings.hang_after_s)
           for cs, suspects_of in clusters[:MAX_FINDINGS]]
    if not out and not any(s.explained for s in stuck.values()):
        out.append(_cycle(stuck, now, host))
    return out


def _by_host(leaves: list[tuple[Collective, list[RankKey]]], host: HostOf):
    """Leaves whose suspects share a host are one problem (a host's ranks hang together, and
    each ring they are in waits on them): clusters of (leaf collectives, their suspects)."""
    clusters: list[tuple[set[str], list[Collective], dict[Collective, list[RankKey]]]] = []
    for c, suspects in leaves:
        hosts = {host(rk) or rank_name(rk) for rk in suspects}
        touching = [cl for cl in clusters if cl[0] & hosts]
        merged = (hosts, [c], {c: suspects})
        for cl in touching:
            clusters.remove(cl)
            merged = (merged[0] | cl[0], cl[1] + merged[1], {**cl[2], **merged[2]})
        clusters.append(merged)
    return [(cs, of) for _, cs, of in sorted(clusters, key=lambda cl: (-len(cl[1]), cl[1][0].seq))]


def _merged(leaves: list[Collective], suspects_of: dict[Collective, list[RankKey]], stuck: dict[Collective, "_Stuck"],
            ranks: Mapping[RankKey, RankView], now: float) -> tuple[RankKey, ...]:
    """The suspects of a cluster: never-joined ones (said so first, idle longest first), then
    those of no-progress leaves in progress order."""
    said: dict[RankKey, bool] = {}
    progress: list[RankKey] = []
    for c in leaves:
        s = stuck[c]
        if s.waits_on:
            flags = dict(s.waits_on)
            for rk in suspects_of[c]:
                said[rk] = said.get(rk, False) or flags.get(rk, False)
        else:
            progress += [rk for rk in suspects_of[c] if rk not in progress]
    joined = [rk for rk, _ in _order(list(said.items()), ranks, now)]
    return tuple(joined + [rk for rk in progress if rk not in said])


def _starting(ranks: Mapping[RankKey, RankView], now: float, grace_s: float) -> frozenset[RankKey]:
    """Ranks that have completed no collective since their telemetry began less than `grace_s`
    ago: a process still starting (its first collective waits on connections and peers)."""
    return frozenset(rk for rk, v in ranks.items()
                     if v.report.recording_s + (now - v.received_at) < grace_s
                     and all(g.last_done_seq < 0 for g in v.report.groups))


def _stuck(ranks: Mapping[RankKey, RankView], now: float, hang_s: float, starting: frozenset[RankKey]):
    """The stuck collectives, and the ranks stuck in one (the hot loop: one pass, few objects).
    A starting rank's pending collective makes nothing stuck."""
    stuck: dict[Collective, _Stuck] = {}
    blocked: set[RankKey] = set()
    seen: dict[tuple, Collective] = {}
    for rk, v in ranks.items():
        if rk in starting:
            continue
        for g in v.report.groups:
            if g.pending_seq < 0:
                continue
            joined_at = v.received_at - g.pending_s
            if now - joined_at < hang_s:
                continue
            blocked.add(rk)
            name = (g.group, rk[1] if g.cross_replica else rk[0], g.pending_seq)
            c = seen.get(name)
            if c is None:
                c = seen[name] = Collective(group_key(rk[0], rk[1], g), g.pending_seq)
                stuck[c] = _Stuck(joined_at, g.kind_name, g.size)
            elif joined_at < stuck[c].first_join:
                stuck[c].first_join = joined_at
    return stuck, blocked


def _members(stuck: dict[Collective, _Stuck], ranks: Mapping[RankKey, RankView], now: float,
             members_of: MembersOf | None, excused: Excused, died_at: Mapping[str, float],
             starting: frozenset[RankKey], restarting: frozenset[str] = frozenset()) -> None:
    """Fill, for each stuck collective, who joined, who is in flight and whom it waits on.
    Members the controller can name are looked up directly; other groups cost one scan. A
    collective with a starting member, in flight or awaited, is explained (not judged yet);
    so is one awaiting a member not heard from since its replica died or restarted less than
    startup_grace_s ago (`restarting`: its new process is starting, its ring not read yet)."""
    def waived(rk: RankKey, since: float) -> bool:
        return rk in starting or excused(rk) or died_at.get(rk[0], -math.inf) >= since
    scanned: dict[GroupKey, list] | None = None
    for c, s in stuck.items():
        expected = members_of(c.key, s.size) if members_of is not None else None
        if expected is not None:
            members = [(rk, v, g) for rk in expected if (v := ranks.get(rk)) is not None
                       for g in v.report.groups if g.group == c.key.group]
        else:
            if scanned is None:
                scanned = _scan(stuck, ranks)
            members = scanned[c.key]
        s.size = max([s.size] + [g.size for _, _, g in members])
        s.in_flight, s.waits_on = [], []
        seen = set()
        for rk, v, g in members:
            seen.add(rk)
            if g.last_joined_seq >= c.seq:
                s.joined += 1
                if g.last_done_seq < c.seq:
                    s.in_flight.append((rk, g))
                    s.explained |= rk in starting
            elif waived(rk, s.first_join):
                s.explained = True
            else:
                s.waits_on.append((rk, v.received_at >= s.first_join))
        if expected is None:
            s.explained |= len(seen) < s.size  # someone is missing, nobody can say who
            continue
        for rk in expected:
            if rk in seen:
                continue
            v = ranks.get(rk)
            if waived(rk, s.first_join) or (v is not None and v.received_at - v.report.recording_s > s.first_join) \
                    or (v is None and rk[0] in restarting):
                s.explained = True  # down, a process younger than the collective, or one not heard from yet
            else:
                s.waits_on.append((rk, False))  # never reported this group: silent


def _scan(stuck: dict[Collective, _Stuck], ranks: Mapping[RankKey, RankView]) -> dict[GroupKey, list]:
    wanted = {c.key: [] for c in stuck}
    for rk, v in ranks.items():
        for g in v.report.groups:
            key = group_key(rk[0], rk[1], g)
            if key in wanted:
                wanted[key].append((rk, v, g))
    return wanted


def _host_lookup(ranks: Mapping[RankKey, RankView], host_of: HostOf | None) -> HostOf:
    def lookup(rk: RankKey) -> str | None:
        v = ranks.get(rk)
        return v.host_id if v is not None else (host_of(rk) if host_of is not None else None)
    return lookup


def _order(culprits: list[tuple[RankKey, bool]], ranks: Mapping[RankKey, RankView], now: float):
    """Suspects that said they never joined first (idle longest first), then silent ones."""
    def idle(rk: RankKey) -> float:
        v = ranks.get(rk)
        return v.report.idle_s + (now - v.received_at) if v is not None else float("inf")
    return sorted(culprits, key=lambda c: (not c[1], -idle(c[0]), c[0]))


def _least_progress(in_flight: list[tuple[RankKey, GroupReport]]):
    """Members in flight ordered by bytes sent (fewest first), then longest without moving."""
    return sorted(in_flight, key=lambda m: (m[1].pending_sent_bytes, -m[1].pending_idle_s, m[0]))


def _progress_suspects(in_flight: list[tuple[RankKey, GroupReport]]) -> tuple[RankKey, ...]:
    """The members that sent the fewest bytes, and the runner-up (a candidate too)."""
    ordered = _least_progress(in_flight)
    fewest = [rk for rk, g in ordered if g.pending_sent_bytes == ordered[0][1].pending_sent_bytes]
    return tuple(fewest) + tuple(rk for rk, _ in ordered[len(fewest):len(fewest) + 1])


def _hosts(suspects: Iterable[RankKey], host: HostOf, by_count: bool = True) -> list[str]:
    """Hosts of the suspects in their order; with `by_count`, the one holding most of them first."""
    counts: dict[str, int] = {}
    for rk in suspects:
        h = host(rk) or "?"
        counts[h] = counts.get(h, 0) + 1
    return sorted(counts, key=lambda h: -counts[h]) if by_count else list(counts)


def _finding(leaves: list[Collective], suspects_of: dict[Collective, list[RankKey]], stuck: dict[Collective, _Stuck],
             ranks: Mapping[RankKey, RankView], host: HostOf, now: float, hang_after_s: float) -> Finding:
    suspects = _merged(leaves, suspects_of, stuck, ranks, now)
    joining = [c for c in leaves if stuck[c].waits_on]
    leaf = joining[0] if joining else leaves[0]
    s = stuck[leaf]
    waited = now - s.first_join
    evidence = [f"{leaf.describe()} ({s.kind}) has waited {waited:.1f} s: {s.joined} of {s.size} members joined"]
    hosts = [h for h in _hosts(suspects, host, by_count=bool(joining)) if h != "?"]
    if joining:
        said = {rk for c in joining for rk, ok in stuck[c].waits_on if ok}
        on_first = sum(1 for rk in suspects if host(rk) == (hosts[0] if hosts else None))
        confidence = (CONFIDENT if said & set(suspects) else SILENT_ONLY) * on_first / max(len(suspects), 1)
        for rk in suspects[:8]:
            where = next(c for c in joining if rk in suspects_of[c]) if any(rk in suspects_of[c] for c in joining) \
                else leaf
            evidence.append(_not_joined(rk, where, ranks, host, now, rk in said))
        what = "never joined"
    else:
        ordered = _least_progress(s.in_flight)
        first, rest = ordered[0], ordered[1:]
        ties = [rk for rk, g in ordered if g.pending_sent_bytes == first[1].pending_sent_bytes]
        confidence = LEAST_PROGRESS / len({host(rk) for rk in ties})
        evidence.append(f"rank {rank_name(first[0])} on host {host(first[0])} sent {first[1].pending_sent_bytes} "
                        f"of {first[1].pending_nbytes} bytes and has not moved for {first[1].pending_idle_s:.1f} s")
        if rest:
            evidence.append(f"the next fewest: rank {rank_name(rest[0][0])} on host {host(rest[0][0])} sent "
                            f"{rest[0][1].pending_sent_bytes} bytes")
        what = "joined without progress in"
    others = [c for c in leaves if c != leaf]
    if others:
        evidence.append(f"{len(others)} other stuck collective(s) wait on the same host(s), e.g. {others[0].describe()}")
    waiting = sum(1 for c in stuck if c not in leaves)
    if waiting:
        evidence.append(f"{waiting} other stuck collective(s) wait on ranks that wait here (the wait-for graph)")
    names = ", ".join(rank_name(rk) for rk in suspects[:4]) + ("…" if len(suspects) > 4 else "")
    where = f" on host {hosts[0]}" if len(hosts) == 1 else (f" on hosts {', '.join(hosts[:4])}" if hosts else "")
    own, witnesses = _evidence(leaves, stuck, ranks, suspects, host, hosts[0] if hosts else None, hang_after_s)
    return Finding(FindingKind.HANG, f"hang:{leaf.describe()}", now, tuple(hosts), round(min(confidence, 1.0), 3),
                   f"rank(s) {names}{where} {what} {leaf.describe()}, which has waited {waited:.0f} s",
                   tuple(evidence), tuple(rank_name(rk) for rk in suspects[:64]), own_evidence=own,
                   witnesses=witnesses)


def _evidence(leaves: list[Collective], stuck: dict[Collective, _Stuck], ranks: Mapping[RankKey, RankView],
              suspects: list[RankKey], host: HostOf, first: str | None, hang_after_s: float):
    """(whether `first`'s own telemetry shows the hang, the hosts whose ranks are stuck in the
    leaves): its own rank is stuck in one of them, or its own report since the first join says
    it has been idle for hang_after_s."""
    members = {rk for c in leaves for rk, _ in (stuck[c].in_flight or ())}
    witnesses = tuple(sorted({h for rk in members if (h := host(rk))}))
    if first is None:
        return False, witnesses
    start = min(stuck[c].first_join for c in leaves)
    own = any(host(rk) == first for rk in members) or any(
        host(rk) == first and (v := ranks.get(rk)) is not None and v.received_at >= start
        and v.report.idle_s >= hang_after_s for rk in suspects)
    return own, witnesses


def _not_joined(rk: RankKey, leaf: Collective, ranks: Mapping[RankKey, RankView], host: HostOf, now: float,
                said: bool) -> str:
    v = ranks.get(rk)
    if v is None:
        return f"rank {rank_name(rk)} on host {host(rk)} never reported telemetry for {leaf.key.describe()}"
    last = next((g.last_joined_seq for g in v.report.groups if group_key(rk[0], rk[1], g) == leaf.key), -1)
    age = now - v.received_at
    if not said:
        return (f"rank {rank_name(rk)} on host {v.host_id} is silent: its last report ({age:.1f} s ago) predates "
                f"the first join; its last collective there was #{last}")
    return (f"rank {rank_name(rk)} on host {v.host_id} never joined: its last collective there is #{last}, "
            f"and it has been idle for {v.report.idle_s + age:.1f} s")


def _cycle(stuck: dict[Collective, _Stuck], now: float, host: HostOf) -> Finding:
    """Every stuck collective waits on a rank stuck in another: a cycle (collectives issued in
    different orders). Named with low confidence: the ranks at the oldest collective."""
    oldest = min(stuck, key=lambda c: stuck[c].first_join)
    ranks = [rk for rk, _ in stuck[oldest].waits_on]
    hosts = _hosts(ranks, host)
    where = [f"{c.describe()} waits on ranks stuck elsewhere" for c in sorted(stuck, key=lambda c: stuck[c].first_join)[:6]]
    return Finding(FindingKind.HANG, f"hang-cycle:{oldest.describe()}", now, tuple(h for h in hosts if h != "?"),
                   round(IN_A_CYCLE / max(len(hosts), 1), 3),
                   f"{len(stuck)} stuck collectives wait on each other in a cycle (mismatched collective order?), "
                   f"the oldest {oldest.describe()}", tuple(where), tuple(rank_name(rk) for rk in ranks))
