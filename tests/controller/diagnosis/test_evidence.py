"""A report accuses only its own ranks (issue 23, attack 7), on a fake clock: one agent, with its
own valid secret, cannot get another host evicted by claiming its rank waits on that host's;
its ages are cut to what its previous reports allow; a hang is acted on with the suspect's own
telemetry, or with more than one other host's."""

from __future__ import annotations

from controller.core.diagnosis.findings import ActionKind, Finding, FindingKind
from controller.core.diagnosis.policy import HostFacts, PolicyView, decide
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import HostReport
from protos.telemetry_ring import Kind

from .synth import CROSS, INTRA, Job, group
from .test_acting import cluster, secret

ATTACKER, VICTIM = ("r1", 0), ("r1", 1)  # on hosts h-r1-0 and h-r1-1


def report(state, job, rk, now):
    v = job.views[rk]
    return state.telemetry(HostReport(v.host_id, 4, (v.report,)), secret(v.host_id), now)


def claim_hang(job, waited_s):
    """The attacker's rank says it has waited `waited_s` in its replica's next collective."""
    job.set(ATTACKER, group(INTRA, Kind.REDUCE_SCATTER, 2, 11, 10, (11, waited_s, 4096, waited_s - 1)),
            group(CROSS, Kind.FTAR_ALL_REDUCE, 3, 20, 20), idle_s=waited_s - 1)


def test_one_host_claiming_another_hangs_evicts_nobody():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    for rk in job.keys():  # every host's own, honest telemetry: all busy, between collectives
        report(s, job, rk, 100.0)
    claim_hang(job, 40.0)
    job.received_at = 100.5
    ignored = report(s, job, ATTACKER, 100.5)
    assert any("more than the 2.5 s its previous report allows; cut" in why for why in ignored), ignored
    # The attacker keeps claiming for real time (its ages now plausible): after hang_after_s
    # the analysis finds the "hang", names the victim, and does not act on one host's word.
    for t in range(1, 40):
        now = 100.5 + t
        claim_hang(job, t + 0.5)
        report(s, job, ATTACKER, now)
        job.set(VICTIM, group(INTRA, Kind.REDUCE_SCATTER, 2, 10, 10), group(CROSS, Kind.FTAR_ALL_REDUCE, 3, 20, 20))
        report(s, job, VICTIM, now)  # the victim, busy, says it has not joined #11
        s.tick(now)
    [entry] = [e for e in s.view.diagnosis.log.entries if e.finding.kind == FindingKind.HANG]
    assert entry.finding.hosts[0] == "h-r1-1" and not entry.finding.own_evidence
    assert entry.finding.witnesses == ("h-r1-0",)
    assert entry.decision.action == ActionKind.REPORT and "only 1 other host(s) (h-r1-0)" in entry.decision.reason
    assert not s.view.hosts["h-r1-1"].cordoned and s.view.hosts["h-r1-1"].assignment is not None


def test_a_hang_the_suspects_own_telemetry_shows_evicts_it():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(VICTIM, waited_s=40.0)  # its own report: idle 45 s, never joined
    for rk in job.keys():
        report(s, job, rk, 100.0)
    s.tick(100.0)
    [entry] = s.view.diagnosis.log.entries
    assert entry.finding.hosts[0] == "h-r1-1" and entry.finding.own_evidence
    assert entry.decision.action == ActionKind.EVICT and s.view.hosts["h-r1-1"].cordoned


def _decision(own: bool, witnesses: tuple[str, ...]):
    f = Finding(FindingKind.HANG, "hang:x", 0.0, ("victim",), 0.95, "x", own_evidence=own, witnesses=witnesses)
    return decide(f, HostFacts(known=True, active=True, cordoned=False, replica_live=True),
                  PolicyView(now=0.0, live_replicas=3, min_replicas=1, free_spares=1, evictions_at=()),
                  DiagnosisSettings())


def test_the_evidence_rule():
    assert _decision(True, ()).action == ActionKind.EVICT  # its own telemetry
    assert _decision(False, ("a",)).action == ActionKind.REPORT  # one other host's word
    assert _decision(False, ("victim", "a")).action == ActionKind.REPORT  # the suspect is no witness of itself
    assert _decision(False, ("a", "b")).action == ActionKind.EVICT  # more than one other host
