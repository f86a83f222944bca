"""Hang analysis, rule by rule, on synthetic telemetry (no processes, time passed in)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.core.diagnosis.findings import FindingKind
from controller.core.diagnosis.hang import CONFIDENT, LEAST_PROGRESS, SILENT_ONLY, find_hangs
from controller.core.diagnosis.settings import DiagnosisSettings
from protos.telemetry_ring import Kind

from .synth import CROSS, INTRA, Job, group

S = DiagnosisSettings(hang_after_s=30.0)
NOW = 1000.0


def members(job: Job):
    def of(key, size):
        if key.replica_id:
            return [(key.replica_id, k) for k in range(size)] if size == job.ranks else None
        return [(rid, key.rank) for rid in job.replicas] if size == len(job.replicas) else None
    return of


def test_a_healthy_job_or_a_young_wait_is_no_hang():
    job = Job()
    assert find_hangs(job.views, NOW, S) == []
    job.never_joins(("r1", 2), waited_s=29.9)  # under hang_after_s
    assert find_hangs(job.views, NOW, S) == []


def test_never_joined_names_the_idle_rank_and_its_host():
    job = Job()
    job.never_joins(("r1", 2))
    [f] = find_hangs(job.views, NOW, S, members(job))
    assert f.kind == FindingKind.HANG and f.hosts == ("h-r1-1",) and f.ranks == ("r1/2",)
    assert f.confidence == CONFIDENT
    assert "never joined collective #11 of group replica of replica r1" in f.summary
    assert "3 of 4 members joined" in f.evidence[0]
    assert any("rank r1/2 on host h-r1-1 never joined: its last collective there is #10" in e for e in f.evidence)
    # the FTAR ops of r0 and r2 wait on r1's ranks, which wait in r1's collective: the graph
    assert any("wait on ranks that wait here" in e for e in f.evidence)


def test_exactly_at_the_threshold_is_stuck():
    job = Job()
    job.never_joins(("r0", 0), waited_s=30.0)
    assert [f.ranks for f in find_hangs(job.views, NOW, S)] == [("r0/0",)]


def test_joined_without_progress_inside_an_ftar_op():
    job = Job()
    job.no_progress(("r2", 3), cross=True)
    [f] = find_hangs(job.views, NOW, S, members(job))
    assert f.hosts[0] == "h-r2-1" and f.ranks[0] == "r2/3" and f.confidence == LEAST_PROGRESS
    assert "joined without progress in collective #21 of group ftar.q1 (rank 3 of every replica)" in f.summary
    assert any("sent 0 of 1048576 bytes" in e for e in f.evidence)


def test_joined_without_progress_inside_an_intra_replica_collective():
    job = Job()
    job.no_progress(("r0", 1), cross=False)
    [f] = find_hangs(job.views, NOW, S, members(job))
    assert (f.hosts[0], f.ranks[0]) == ("h-r0-0", "r0/1")
    assert "collective #11 of group replica of replica r0" in f.summary


def test_equal_least_progress_on_two_hosts_halves_the_confidence():
    job = Job()
    job.no_progress(("r1", 0), cross=False)
    other = ("r1", 3)  # another host, also at zero bytes sent
    v = job.views[other]
    stuck = v.report.groups[0]._replace(pending_sent_bytes=0)
    job.set(other, stuck, v.report.groups[1])
    [f] = find_hangs(job.views, NOW, S)
    assert set(f.hosts[:2]) == {"h-r1-0", "h-r1-1"} and f.confidence == pytest.approx(LEAST_PROGRESS / 2)


def test_a_silent_rank_is_a_suspect_after_those_that_said_they_never_joined():
    job = Job()
    job.never_joins(("r1", 2))
    # r1/3 (same replica) has not reported since before the collective started
    old = job.views[("r1", 3)]
    job.set(("r1", 3), group(INTRA, Kind.REDUCE_SCATTER, 4, 10, 10), old.report.groups[1], received_at=NOW - 60)
    [f] = find_hangs(job.views, NOW, S)
    assert f.ranks == ("r1/2", "r1/3") and f.hosts == ("h-r1-1",)
    assert any("is silent: its last report (60.0 s ago) predates the first join" in e for e in f.evidence)


def test_only_silent_suspects_lower_the_confidence_and_missing_members_are_named():
    job = Job()
    job.never_joins(("r1", 2))
    del job.views[("r1", 2)]  # its agent never sent anything: known only from the layout
    [f] = find_hangs(job.views, NOW, S, members(job), host_of=lambda rk: job.host(rk))
    assert f.ranks == ("r1/2",) and f.hosts == ("h-r1-1",) and f.confidence == SILENT_ONLY
    assert any("never reported telemetry" in e for e in f.evidence)
    # without the layout the groups' sizes say someone is missing, but nobody can say who:
    # no finding (the host's silence is the heartbeat's to find)
    assert find_hangs(job.views, NOW, S) == []


def test_a_whole_host_that_never_joined_is_one_suspect_host():
    job = Job(ranks=4, per_host=2)
    job.never_joins(("r1", 2))
    for rk in (("r1", 3),):  # its host-mate hangs too
        job.set(rk, *job.views[("r1", 2)].report.groups, idle_s=45)
    [f] = find_hangs(job.views, NOW, S)
    assert f.hosts == ("h-r1-1",) and set(f.ranks) == {"r1/2", "r1/3"} and f.confidence == CONFIDENT


def test_two_independent_hangs_are_two_findings():
    job = Job(replicas=4)
    job.never_joins(("r1", 2))
    for rk in job.keys():  # r3 hangs the same way, on rank 0
        if rk[0] == "r3":
            g = job.views[rk].report.groups
            if rk == ("r3", 0):  # hung outside collectives: in no FTAR op either
                job.set(rk, group(INTRA, Kind.REDUCE_SCATTER, 4, 10, 10),
                        group(CROSS, Kind.FTAR_ALL_REDUCE, 4, 20, 20), idle_s=50)
            else:
                job.set(rk, group(INTRA, Kind.REDUCE_SCATTER, 4, 11, 10, (11, 40, 10, 39)), g[1])
    found = find_hangs(job.views, NOW, S)
    assert sorted(f.ranks[0] for f in found) == ["r1/2", "r3/0"]


def test_collectives_waiting_on_each_other_are_a_cycle():
    job = Job(replicas=2, ranks=2, per_host=1)
    # r0/0 waits in the intra op for r0/1; r0/1 waits in its FTAR op for r1/1; r1/1 waits in
    # its intra op for r1/0; r1/0 waits in its FTAR op for r0/0: every wait reaches a stuck rank.
    job.set(("r0", 0), group(INTRA, Kind.ALL_REDUCE, 2, 11, 10, (11, 40, 5, 40)), group(CROSS, Kind.FTAR_ALL_REDUCE, 2, 20, 20))
    job.set(("r0", 1), group(INTRA, Kind.ALL_REDUCE, 2, 10, 10), group(CROSS, Kind.FTAR_ALL_REDUCE, 2, 21, 20, (21, 40, 5, 40)))
    job.set(("r1", 1), group(INTRA, Kind.ALL_REDUCE, 2, 11, 10, (11, 40, 5, 40)), group(CROSS, Kind.FTAR_ALL_REDUCE, 2, 20, 20))
    job.set(("r1", 0), group(INTRA, Kind.ALL_REDUCE, 2, 10, 10), group(CROSS, Kind.FTAR_ALL_REDUCE, 2, 21, 20, (21, 40, 5, 40)))
    [f] = find_hangs(job.views, NOW, S)
    assert f.key.startswith("hang-cycle:") and f.confidence < S.min_confidence
    assert "wait on each other in a cycle" in f.summary


def test_clock_skew_between_hosts_does_not_matter():
    """Ages are measured on each host's clock and anchored at receive time: two hosts whose
    clocks differ by an hour report the same ages, so the analysis is the same."""
    job = Job()
    job.never_joins(("r1", 2))
    before = find_hangs(job.views, NOW, S)
    for rk, v in job.views.items():  # reports arrive up to 2 s apart; ages are relative to each arrival
        shift = 2.0 * (rk[1] % 2)
        job.views[rk] = replace(v, received_at=v.received_at + shift,
                                report=v.report._replace(groups=tuple(
                                    g._replace(pending_s=g.pending_s + shift) if g.pending_seq >= 0 else g
                                    for g in v.report.groups)))
    after = find_hangs(job.views, NOW + 2, S)
    assert [f.ranks for f in after] == [f.ranks for f in before]


@pytest.mark.parametrize("recording_s, found", [(45.0, False), (S.startup_grace_s + 1, True)])
def test_a_job_still_starting_is_judged_only_after_the_startup_grace(recording_s, found):
    """Every rank joined its first collective 40 s ago and none completed one (connections, a
    loaded host's start): within the start-up grace that is no hang; past it, it is."""
    job = Job(replicas=1, ranks=2)
    for rk in job.keys():
        sent = 0 if rk == ("r0", 1) else 4096
        job.views[rk] = replace(job.views[rk], report=job.views[rk].report._replace(
            recording_s=recording_s, groups=(group(INTRA, Kind.ALL_REDUCE, 2, 0, -1, (0, 40.0, sent, 39.0)),)))
    findings = find_hangs(job.views, NOW, S, members(job))
    assert [f.ranks[0] for f in findings] == (["r0/1"] if found else [])


def test_a_starting_rank_explains_a_wait_but_a_started_one_is_judged():
    """r0/1 restarted (young telemetry, nothing completed) and has not joined its replica's
    collective that r0/0 waits in: explained, not a finding; once it completed a collective
    (it started) and hangs again, it is named."""
    job = Job(replicas=2, ranks=2)
    job.never_joins(("r0", 1))
    culprit = job.views[("r0", 1)]
    job.views[("r0", 1)] = replace(culprit, report=culprit.report._replace(
        recording_s=5.0, groups=(group(INTRA, Kind.REDUCE_SCATTER, 2, 9, -1),)))
    assert find_hangs(job.views, NOW, S, members(job)) == []
    job.views[("r0", 1)] = replace(culprit, report=culprit.report._replace(recording_s=5.0))
    assert [f.ranks for f in find_hangs(job.views, NOW, S, members(job))] == [("r0/1",)]
