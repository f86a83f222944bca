"""A restarted rank is not judged on its predecessor's telemetry (issue 28's chaos seed 22, on a
fake clock): replica r1 (both ranks on host h1) dies; a report of its old rank 0, in flight at
the death, arrives after it; the new rank 1 is past its start-up and waits in its first
collective for the new rank 0, whose ring was not read yet (a cold start under load). The old
process's report is left out, and the wait names nobody until startup_grace_s after the
restart; past it a silent rank is judged like any other."""

from __future__ import annotations

from controller.core.diagnosis.engine import Diagnosis
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import HostReport, RankReport
from protos.telemetry_ring import Kind

from .synth import INTRA, group

S = DiagnosisSettings(hang_after_s=20.0, startup_grace_s=60.0, analysis_interval_s=1.0)
R0, R1 = ("r1", 0), ("r1", 1)
DIED = 110.0


def members(key, size):
    return [(key.replica_id, k) for k in range(size)] if key.replica_id == "r1" else None


def ingest(d, now, *ranks):
    return d.ingest(HostReport("h1", 4, tuple(ranks)), now, lambda rk: True)[1]


def rank(rk, recording_s, idle_s, *groups):
    return RankReport(rk[0], rk[1], idle_s, recording_s, tuple(groups))


def restarted():
    """r1 trained since 0 (its processes' rings began at 0); died at 110; the old rank 0's last
    report arrives at 110.5; at 120 the new rank 1 (began at 115) joined #5825 of the replica
    group after its plan (#5824, done)."""
    d = Diagnosis(S, 4)
    ingest(d, 100.0, rank(R0, 100.0, 0.1, group(INTRA, Kind.ALL_REDUCE, 2, 300, 300)),
           rank(R1, 100.0, 0.1, group(INTRA, Kind.ALL_REDUCE, 2, 300, 300)))
    d.forget_replica("r1", DIED)
    ignored = ingest(d, 110.5, rank(R0, 110.5, 1.0, group(INTRA, Kind.ALL_REDUCE, 2, 301, 301)))
    return d, ignored


def new_rank1(d, now):
    waited = now - 120.0
    ingest(d, now, rank(R1, now - 115.0, waited, group(INTRA, Kind.ALL_GATHER, 2, 5825, 5824,
                                                       (5825, waited, 0, waited))))


def test_the_predecessors_report_in_flight_at_the_death_is_left_out():
    d, ignored = restarted()
    assert R0 not in d.ranks
    assert any("rank r1/0: this telemetry is of the process that ran it before replica r1 died" in why
               for why in ignored), ignored


def test_a_rank_not_heard_from_since_its_restart_is_starting_for_the_grace():
    d, _ = restarted()
    for now in (145.0, 160.0, 169.0):  # #5825 waited 25..49 s; the restart was 35..59 s ago
        new_rank1(d, now)
        assert d.analyze(now, members, lambda rk: "h1", lambda rk: False) == [], now


def test_past_the_grace_a_silent_restarted_rank_is_judged():
    d, _ = restarted()
    new_rank1(d, 175.0)  # the restart was 65 s ago: the new rank 0 never reported
    [f] = d.analyze(175.0, members, lambda rk: "h1", lambda rk: False)
    assert f.hosts == ("h1",) and f.ranks[0] == "r1/0" and f.own_evidence
    assert any("never reported telemetry" in e for e in f.evidence), f.evidence


def test_the_new_process_is_taken_and_clears_the_mark():
    d, _ = restarted()
    ignored = ingest(d, 130.0, rank(R0, 12.0, 0.5, group(INTRA, Kind.ALL_GATHER, 2, 5825, 5825)))
    assert ignored == [] and d.ranks[R0].report.recording_s == 12.0 and R0 not in d.gone_began
    # the old process's report, later still, is left out; the new one's kept
    assert d.ranks[R0].received_at == 130.0


def test_a_rank_that_reports_on_after_its_replica_died_is_not_a_predecessor_of_a_later_process():
    d = Diagnosis(S, 4)
    d.forget_replica("r1", DIED)  # no view of r1/0 then: nothing is marked
    assert ingest(d, 111.0, rank(R0, 300.0, 0.1, group(INTRA, Kind.ALL_REDUCE, 2, 5, 5))) == []
    assert R0 in d.ranks
