"""The closed loop: telemetry and digest verdicts in, findings and decisions out, evictions
through the host registry (cordon + swap onto a spare, `HostRegistry.evict`). Time passed in.

Every finding is logged with its decision (`GET /api/v1/diagnoses`) and becomes an event
(`diagnosis`) that names the suspect, the evidence's gist, the action and its reason. A held
finding (a limit: no spare, the hourly budget, min_replicas) is decided again on later ticks
until `hold_s` has passed.

`Diagnostician` owns the diagnosis (`engine`: telemetry, findings, the decision log). It reads
the records it is handed (`Facts`: live views of the hosts, replicas, rank holders, quorum)
and yields intents (controller.core.intents), one finding at a time: each finding is decided
on the facts as the previous one's eviction left them, so the caller carries out each batch
before it asks for the next (`for intents in ...: act(intents)`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from controller.core.digests import Verdict
from controller.core.diagnosis.engine import Diagnosis
from controller.core.diagnosis.findings import ActionKind, Entry, Finding
from controller.core.diagnosis.policy import HostFacts, PolicyView, decide
from controller.core.diagnosis.telemetry import GroupKey, HostReport, RankKey, check_report
from controller.core.intents import Announce, Evict, Intent
from controller.core.model import Host, HostState, Quorum, Replica, ReplicaState
from controller.settings import ControllerSettings

_NOT_LIVE = (ReplicaState.DEAD, ReplicaState.FINISHED)


@dataclass(frozen=True)
class Facts:
    """What the diagnosis reads of the rest of the controller (live views, never changed here)."""

    hosts: Mapping[str, Host]
    replicas: Mapping[str, Replica]
    rank_holders: Mapping[tuple[str, int], str]
    quorum: Quorum | None


class Diagnostician:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        #: telemetry, findings and what was done about them (not persisted: rebuilt from reports)
        self.engine = Diagnosis(settings.diagnosis, settings.digest_steps_kept)

    @property
    def enabled(self) -> bool:
        return self.settings.diagnosis.enabled

    def check(self, report: HostReport) -> None:
        check_report(report, self.settings.max_id_chars)

    def ingest(self, report: HostReport, h: Host, replicas: Mapping[str, Replica],
               now: float) -> tuple[list[Finding], list[str]]:
        """Keep an authenticated agent's summary; returns its findings and what was left out and why."""
        if not self.enabled:
            return [], ["the diagnosis is disabled on this controller"]
        runs = set((h.assignment.replica_id, r) for r in h.assignment.ranks) if h.assignment else set()
        live = sum(r.world_size for r in replicas.values() if r.state not in _NOT_LIVE)
        return self.engine.ingest(report, now, runs.__contains__, live)

    def periodic(self, facts: Facts, now: float) -> Iterator[list[Intent]]:
        """The periodic analysis (hangs, windows that waited), and held findings decided again."""
        d = self.engine
        if not self.enabled or not d.due(now):
            return
        yield from self.decide(d.analyze(now, lambda key, size: _group_members(facts, key, size),
                                         facts.rank_holders.get, lambda rank: _rank_down(facts, rank)), facts, now)
        for entry_id, since in list(d.held.items()):
            entry = next((e for e in d.log.entries if e.id == entry_id), None)
            if entry is None or now - since > self.settings.diagnosis.hold_s:
                del d.held[entry_id]
                continue
            decision = self._decide(entry.finding, facts, now)
            if decision.action != ActionKind.HOLD or decision.reason != entry.decision.reason:
                entry = d.log.redecide(entry_id, decision, now)
                d.logged(entry.finding, entry)
                yield self._apply(entry, now, again=True)

    def verdicts(self, verdicts: list[Verdict], facts: Facts, now: float) -> Iterator[list[Intent]]:
        """Digest mismatches become SDC findings (hosts named by rank digests)."""
        if not self.enabled:
            return
        holders = facts.rank_holders
        for v in verdicts:
            if v.mismatch:
                yield from self.decide(self.engine.incidents(
                    v, lambda rid, rank: holders.get((rid, rank)),
                    lambda rid: sorted({h for (r, _), h in holders.items() if r == rid}), now), facts, now)

    def decide(self, findings: list[Finding], facts: Facts, now: float) -> Iterator[list[Intent]]:
        """Each finding decided and logged; a hang decided before on less evidence (its suspect's
        own telemetry read late) is decided again in its entry, with the evidence it has now."""
        d = self.engine
        for f in findings:
            decision = self._decide(f, facts, now)
            entry_id = d.redecides(f)
            entry = d.log.redecide(entry_id, decision, now, f) if entry_id is not None else None
            if entry is None:
                entry = d.log.add(f, decision, now)
            d.logged(f, entry)
            yield self._apply(entry, now, again=entry_id is not None and entry.id == entry_id)

    def evicted(self, host_id: str, now: float) -> None:
        """An eviction this diagnosis asked for took place."""
        self.engine.evictions_at.append(now)
        self.engine.forget_host(host_id)

    def keep_rank_digests(self, replica_id: str, step: int, rank_digests, holders) -> None:
        self.engine.keep_rank_digests(replica_id, step, rank_digests, holders)

    def forget_replica(self, replica_id: str, now: float) -> None:
        self.engine.forget_replica(replica_id, now)

    # -- internals ---------------------------------------------------------------------------

    def _decide(self, f: Finding, facts: Facts, now: float):
        h = facts.hosts.get(f.hosts[0]) if f.hosts else None
        replica = facts.replicas.get(h.assignment.replica_id) if h is not None and h.assignment else None
        known = HostFacts(known=h is not None,
                          active=h is not None and h.state == HostState.ACTIVE and h.assignment is not None,
                          cordoned=h is not None and h.cordoned,
                          replica_live=replica is not None and replica.state not in _NOT_LIVE)
        view = PolicyView(now=now, live_replicas=sum(r.state not in _NOT_LIVE for r in facts.replicas.values()),
                          min_replicas=self.settings.min_replicas,
                          free_spares=sum(x.state == HostState.SPARE and not x.cordoned for x in facts.hosts.values()),
                          evictions_at=tuple(self.engine.evictions_at))
        return decide(f, known, view, self.settings.diagnosis)

    def _apply(self, entry: Entry, now: float, again: bool = False) -> list[Intent]:
        f, dec, d = entry.finding, entry.decision, self.engine
        out: list[Intent] = [Announce(
            "diagnosis", dec.host_id or f.kind.value,
            f"{f.kind.value} finding {entry.id}{' (decided again)' if again else ''}: {f.summary}; "
            f"{dec.action.value}: {dec.reason}", f.kind.value,
            level="warning" if dec.action in (ActionKind.EVICT, ActionKind.HOLD) else "info")]
        if dec.action == ActionKind.HOLD:
            d.held.setdefault(entry.id, now)
            return out
        d.held.pop(entry.id, None)
        if dec.action == ActionKind.EVICT:
            out.append(Evict(dec.host_id, f"diagnosis finding {entry.id} ({f.kind.value}): {f.summary}",
                             f"finding {entry.id}", f.kind.value))
        return out


def _group_members(facts: Facts, key: GroupKey, size: int) -> list[RankKey] | None:
    """Who belongs to a group, when the controller knows: a replica's world, or a ring's
    rank position over the current quorum."""
    if key.replica_id:
        r = facts.replicas.get(key.replica_id)
        return [(key.replica_id, k) for k in range(size)] if r is not None and r.world_size == size else None
    if facts.quorum is not None and len(facts.quorum.members) == size:
        return [(m.replica_id, key.rank) for m in facts.quorum.members]
    return None


def _rank_down(facts: Facts, rank: RankKey) -> bool:
    """The controller already handles this rank: its replica is dead (being rebuilt) or gone."""
    r = facts.replicas.get(rank[0])
    return r is None or r.state in _NOT_LIVE
