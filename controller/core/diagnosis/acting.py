"""The closed loop: telemetry and digest verdicts in, findings and decisions out, evictions
through the host registry (cordon + swap onto a spare, `HostRegistry.evict`). Time passed in.

Every finding is logged with its decision (`GET /api/v1/diagnoses`) and becomes an event
(`diagnosis`) that names the suspect, the evidence's gist, the action and its reason. A held
finding (a limit: no spare, the hourly budget, min_replicas) is decided again on later ticks
until `hold_s` has passed.
"""

from __future__ import annotations

from controller.core.digests import Verdict
from controller.core.diagnosis.engine import Diagnosis
from controller.core.diagnosis.findings import ActionKind, Entry, Finding
from controller.core.diagnosis.policy import HostFacts, PolicyView, decide
from controller.core.diagnosis.telemetry import GroupKey, HostReport, RankKey, check_report
from controller.core.errors import RequestError
from controller.core.model import HostState, ReplicaState

_NOT_LIVE = (ReplicaState.DEAD, ReplicaState.FINISHED)


class Diagnosing:
    """Mixin of ControllerState: the diagnosis (`self.diagnosis`) and what it does."""

    def init_diagnosis(self) -> None:
        self.diagnosis = Diagnosis(self.settings.diagnosis, self.settings.digest_steps_kept)

    def report_telemetry(self, report: HostReport, agent_secret: str, now: float) -> list[str]:
        """Keep an agent's summary (its agent secret checked); returns what was left out and why."""
        check_report(report, self.settings.max_id_chars)
        h = self.authenticate_agent(report.host_id, agent_secret)
        if not self.settings.diagnosis.enabled:
            return ["the diagnosis is disabled on this controller"]
        runs = set((h.assignment.replica_id, r) for r in h.assignment.ranks) if h.assignment else set()
        live = sum(r.world_size for r in self.replicas.values() if r.state not in _NOT_LIVE)
        findings, ignored = self.diagnosis.ingest(report, now, runs.__contains__, live)
        self._decide_findings(findings, now)
        return ignored

    def diagnose(self, now: float) -> None:
        """The periodic analysis (hangs, windows that waited), and held findings decided again."""
        d = self.diagnosis
        if not self.settings.diagnosis.enabled or not d.due(now):
            return
        self._decide_findings(d.analyze(now, self._group_members, self.rank_holders.get, self._rank_down), now)
        for entry_id, since in list(d.held.items()):
            entry = next((e for e in d.log.entries if e.id == entry_id), None)
            if entry is None or now - since > self.settings.diagnosis.hold_s:
                del d.held[entry_id]
                continue
            decision = self._decide(entry.finding, now)
            if decision.action != ActionKind.HOLD or decision.reason != entry.decision.reason:
                entry = d.log.redecide(entry_id, decision, now)
                d.logged(entry.finding, entry)
                self._apply(entry, now, again=True)

    def diagnose_verdicts(self, verdicts: list[Verdict], now: float) -> None:
        """Digest mismatches become SDC findings (hosts named by rank digests)."""
        if not self.settings.diagnosis.enabled:
            return
        for v in verdicts:
            if v.mismatch:
                self._decide_findings(self.diagnosis.incidents(v, self._rank_host, self._replica_hosts, now), now)

    # -- internals ---------------------------------------------------------------------------

    def _decide_findings(self, findings: list[Finding], now: float) -> None:
        """Each finding decided and logged; a hang decided before on less evidence (its suspect's
        own telemetry read late) is decided again in its entry, with the evidence it has now."""
        d = self.diagnosis
        for f in findings:
            decision = self._decide(f, now)
            entry_id = d.redecides(f)
            entry = d.log.redecide(entry_id, decision, now, f) if entry_id is not None else None
            if entry is None:
                entry = d.log.add(f, decision, now)
            d.logged(f, entry)
            self._apply(entry, now, again=entry_id is not None and entry.id == entry_id)

    def _decide(self, f: Finding, now: float):
        h = self.hosts.get(f.hosts[0]) if f.hosts else None
        replica = self.replicas.get(h.assignment.replica_id) if h is not None and h.assignment else None
        facts = HostFacts(known=h is not None,
                          active=h is not None and h.state == HostState.ACTIVE and h.assignment is not None,
                          cordoned=h is not None and h.cordoned,
                          replica_live=replica is not None and replica.state not in _NOT_LIVE)
        view = PolicyView(now=now, live_replicas=sum(r.state not in _NOT_LIVE for r in self.replicas.values()),
                          min_replicas=self.settings.min_replicas,
                          free_spares=sum(x.state == HostState.SPARE and not x.cordoned for x in self.hosts.values()),
                          evictions_at=tuple(self.diagnosis.evictions_at))
        return decide(f, facts, view, self.settings.diagnosis)

    def _apply(self, entry: Entry, now: float, again: bool = False) -> None:
        f, dec, d = entry.finding, entry.decision, self.diagnosis
        self._event(now, "diagnosis", dec.host_id or f.kind.value,
                    f"{f.kind.value} finding {entry.id}{' (decided again)' if again else ''}: {f.summary}; "
                    f"{dec.action.value}: {dec.reason}", f.kind.value,
                    level="warning" if dec.action in (ActionKind.EVICT, ActionKind.HOLD) else "info")
        if dec.action == ActionKind.HOLD:
            d.held.setdefault(entry.id, now)
            return
        d.held.pop(entry.id, None)
        if dec.action == ActionKind.EVICT:
            try:
                self.evict(dec.host_id, "diagnosis", f"diagnosis finding {entry.id} ({f.kind.value}): {f.summary}", now)
            except RequestError as exc:  # the host changed between deciding and acting
                self._event(now, "diagnosis", dec.host_id, f"finding {entry.id}: eviction of host {dec.host_id} "
                                                           f"failed: {exc}", f.kind.value)
                return
            d.evictions_at.append(now)
            d.forget_host(dec.host_id)

    def _group_members(self, key: GroupKey, size: int) -> list[RankKey] | None:
        """Who belongs to a group, when the controller knows: a replica's world, or a ring's
        rank position over the current quorum."""
        if key.replica_id:
            r = self.replicas.get(key.replica_id)
            return [(key.replica_id, k) for k in range(size)] if r is not None and r.world_size == size else None
        if self.quorum is not None and len(self.quorum.members) == size:
            return [(m.replica_id, key.rank) for m in self.quorum.members]
        return None

    def _rank_down(self, rank: RankKey) -> bool:
        """The controller already handles this rank: its replica is dead (being rebuilt) or gone."""
        r = self.replicas.get(rank[0])
        return r is None or r.state in _NOT_LIVE

    def _rank_host(self, replica_id: str, rank: int) -> str | None:
        return self.rank_holders.get((replica_id, rank))

    def _replica_hosts(self, replica_id: str) -> list[str]:
        return sorted({h for (rid, _), h in self.rank_holders.items() if rid == replica_id})
