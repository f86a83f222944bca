"""A hang reported for lack of evidence is decided again when the evidence arrives (issue 23's
evidence rule, on a fake clock): the suspect's own telemetry read late, or more hosts whose
ranks wait on it, turn the same finding's REPORT into an eviction; its log entry is decided
again (one finding, not two), and the rule's protection stays (one witness alone evicts nobody).
"""

from __future__ import annotations

import pytest

from controller.core.diagnosis.engine import Reported, stronger, support
from controller.core.diagnosis.findings import ActionKind, Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.engine import Diagnosis
from protos.telemetry_ring import Kind

from .synth import CROSS, INTRA, Job, group
from .test_acting import cluster
from .test_evidence import report

WITNESS, SUSPECT = ("r1", 0), ("r1", 1)  # hosts h-r1-0 and h-r1-1
RING_PEERS = (("r0", 1), ("r2", 1))  # rank 1 of the other replicas: the FTAR ring with the suspect


def waits(job, rk, seq, waited_s, cross=False):
    """`rk` joined collective `seq` `waited_s` ago (of its replica's group, or its FTAR ring)."""
    stuck = (seq, waited_s, 4096, waited_s - 1)
    if cross:
        job.set(rk, group(INTRA, Kind.REDUCE_SCATTER, 2, 11, 11), group(CROSS, Kind.FTAR_ALL_REDUCE, 3, seq, seq - 1, stuck),
                idle_s=waited_s - 1)
    else:
        job.set(rk, group(INTRA, Kind.REDUCE_SCATTER, 2, seq, seq - 1, stuck), group(CROSS, Kind.FTAR_ALL_REDUCE, 3, 20, 20),
                idle_s=waited_s - 1)


def reported_hang(s, job):
    """Every host reports at 100 (busy); then only the witness, waiting in #11 for the suspect,
    whose telemetry is read late: at 131 the hang is found on one other host's word."""
    for rk in job.keys():
        report(s, job, rk, 100.0)
    for t in range(1, 32):
        waits(job, WITNESS, 11, t)
        report(s, job, WITNESS, 100.0 + t)
        s.tick(100.0 + t)
    [entry] = hangs(s)
    assert entry.finding.hosts[0] == "h-r1-1" and not entry.finding.own_evidence
    assert entry.decision.action == ActionKind.REPORT and not s.view.hosts["h-r1-1"].cordoned
    return entry


def hangs(s):
    return [e for e in s.view.diagnosis.log.entries if e.finding.kind == FindingKind.HANG]


def run_until(s, job, start, end, send=()):
    for t in range(start, end):
        waits(job, WITNESS, 11, t - 100)
        report(s, job, WITNESS, float(t))
        for rk in send:
            report(s, job, rk, float(t))
        s.tick(float(t))


def test_the_suspects_own_idle_telemetry_read_late_decides_the_reported_hang_again():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    first = reported_hang(s, job)
    # h-r1-1's agent reads its ring late: idle since before #11, it never joined
    job.set(SUSPECT, group(INTRA, Kind.REDUCE_SCATTER, 2, 10, 10), group(CROSS, Kind.FTAR_ALL_REDUCE, 3, 20, 20),
            idle_s=34.0)
    run_until(s, job, 132, 142, send=(SUSPECT,))
    [entry] = hangs(s)
    assert entry.id == first.id and entry.finding.own_evidence
    assert entry.decision.action == ActionKind.EVICT, entry.decision.reason
    assert s.view.hosts["h-r1-1"].cordoned and s.view.hosts["s0"].assignment is not None
    log = s.view.diagnosis.log
    assert log.findings_by_kind["hang"] == 1 and log.actions_by_kind["evict"] == 1
    assert any("(decided again)" in e.message and "evict: evict host h-r1-1" in e.message
               for e in s.view.events if e.kind == "diagnosis")


def test_more_hosts_waiting_on_the_suspect_decide_the_reported_hang_again():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    first = reported_hang(s, job)
    for rk in RING_PEERS:  # their agents' reports, read late: in the FTAR ring's #21 since 101
        waits(job, rk, 21, 34.0, cross=True)
    run_until(s, job, 132, 142, send=RING_PEERS)
    [entry] = hangs(s)
    assert entry.id == first.id and not entry.finding.own_evidence
    assert set(entry.finding.witnesses) == {"h-r1-0", "h-r0-1", "h-r2-1"}
    assert entry.decision.action == ActionKind.EVICT and s.view.hosts["h-r1-1"].cordoned


def test_the_suspects_busy_telemetry_keeps_it_reported():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    reported_hang(s, job)
    job.set(SUSPECT, group(INTRA, Kind.REDUCE_SCATTER, 2, 10, 10), group(CROSS, Kind.FTAR_ALL_REDUCE, 3, 20, 20))
    run_until(s, job, 132, 160, send=(SUSPECT,))  # it says it is busy, not idle
    [entry] = hangs(s)
    assert entry.decision.action == ActionKind.REPORT and not s.view.hosts["h-r1-1"].cordoned


def _hang(own, witnesses, host="v", confidence=0.7):
    return Finding(FindingKind.HANG, "hang:x", 0.0, (host,), confidence, "x", own_evidence=own, witnesses=witnesses)


@pytest.mark.parametrize("before, now, more", [
    ((False, 1), (True, 1), True),   # its own telemetry, read late
    ((False, 1), (False, 2), True),  # a second other host
    ((False, 1), (False, 1), False),
    ((True, 1), (True, 1), False),
    ((True, 2), (False, 1), False),  # less is not more
    ((True, 0), (False, 3), True),
])
def test_stronger_evidence(before, now, more):
    assert stronger(now, before) is more


def test_support_does_not_count_the_suspect_as_its_own_witness():
    assert support(_hang(False, ("v", "a"))) == (False, 1)


@pytest.mark.parametrize("action, again", [
    (None, True), (ActionKind.REPORT, True), (ActionKind.HOLD, True),
    (ActionKind.EVICT, False), (ActionKind.DRY_RUN, False),
])
def test_only_an_undecided_hang_is_news_on_more_evidence(action, again):
    before = Reported(("v",), 0.7, (False, 1), 7, action)
    assert Diagnosis._news(_hang(True, ("a",)), before) is again
    assert Diagnosis._news(_hang(False, ("a",)), before) is False  # nothing new
    d = Diagnosis(DiagnosisSettings(), 4)
    d.active_hangs["hang:x"] = before
    assert d.redecides(_hang(True, ("a",))) == 7 and d.redecides(_hang(True, ("a",), host="w")) is None
