"""The closed loop in the controller core on a fake clock: telemetry and digests in, findings, the
policy's decisions, evictions through the host registry (cordon + swap), limits and dry-run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import HostReport, RankReport
from controller.core.errors import InvalidArgument, NotFound, PermissionDenied
from controller.core.identity import hash_secret
from controller.core.model import Assignment, HostState, JoinRequest, ReplicaState
from controller.settings import ControllerSettings

from .synth import Job, windows
from tests.controller.drive import Driver

REPLICAS = ("r0", "r1", "r2")


def cluster(spares=("s0",), min_replicas=2, **diagnosis):
    d = DiagnosisSettings(hang_after_s=30.0, analysis_interval_s=5.0, **diagnosis)
    s = Driver(ControllerSettings(replicas=3, min_replicas=min_replicas, heartbeat_timeout_s=1e6, diagnosis=d))
    for rid in REPLICAS:
        for k in range(2):
            host = f"h-{rid}-{k}"
            s.register(host, f"i-{rid}-{k}", 0.0, assignment=Assignment(rid, (k,), 2),
                             secret_hash=hash_secret(secret(host)))
    for sp in spares:
        s.register(sp, "i-" + sp, 0.0, spare=True, secret_hash=hash_secret(secret(sp)))
    commit_round(s, 0)
    s.take_orders()
    return s


def secret(host: str) -> str:
    return f"secret-of-{host}"


def commit_round(s, step, now=0.0, **reports):
    """Every replica joins `step`, the round closes; `reports[rid]` (kwargs) commits it."""
    for rid in REPLICAS:
        s.join(JoinRequest(rid, step, 2, host_id=f"h-{rid}-0"), now)
    q = s.close_round(now)
    for rid, kw in reports.items():
        s.report(rid, step, now, quorum_id=q.quorum_id, host_id=f"h-{rid}-0", **kw)
    return q


def send(state, job, now, **kw):
    by_host: dict[str, list[RankReport]] = {}
    for rk, v in job.views.items():
        by_host.setdefault(v.host_id, []).append(v.report)
    for host, ranks in sorted(by_host.items()):
        state.telemetry(HostReport(host, kw.get("window", 4), tuple(ranks)), secret(host), now)


def diagnoses(state):
    return [e for e in state.view.events if e.kind == "diagnosis"]


def orders(s):
    return sorted((o.host_id, o.kind) for o in s.take_orders())


def test_a_hang_is_found_on_the_tick_and_its_host_evicted_onto_the_spare():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(("r1", 1), waited_s=40.0)
    send(s, job, 100.0)
    s.tick(100.0)
    [entry] = s.view.diagnosis.log.entries
    assert entry.finding.kind.value == "hang" and entry.finding.hosts[0] == "h-r1-1"
    assert entry.decision.action.value == "evict"
    h = s.view.hosts["h-r1-1"]
    assert h.cordoned and h.cordon_by == "diagnosis" and "diagnosis finding 1 (hang)" in h.cordon_reason
    assert h.assignment is None and s.view.hosts["s0"].assignment == Assignment("r1", (1,), 2)
    assert s.view.replicas["r1"].state == ReplicaState.DEAD and "is being evicted" in s.view.replicas["r1"].reason
    assert orders(s) == [("h-r1-0", "RESTART"), ("h-r1-1", "STOP"), ("s0", "ASSIGN")]
    [event] = diagnoses(s)
    assert "hang finding 1: rank(s) r1/1 on host h-r1-1 never joined" in event.message
    assert "evict: evict host h-r1-1" in event.message
    assert s.view.diagnosis.log.actions_by_kind["evict"] == 1 and s.view.diagnosis.log.findings_by_kind["hang"] == 1
    # the evicted host's (and dead replica's) telemetry is forgotten: nothing is found again
    s.tick(106.0)
    assert len(s.view.diagnosis.log.entries) == 1
    # a diagnosis cordon survives the agent registering again (after its old agent died)
    s.deregister("h-r1-1", "i-r1-1", "its agent died", 106.5)
    s.register("h-r1-1", "i-new", 107.0)
    assert s.view.hosts["h-r1-1"].cordoned


def test_the_same_hang_is_reported_once_and_the_tick_is_rate_limited():
    s = cluster(spares=())  # no spare: held, not evicted
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(("r1", 1), waited_s=40.0)
    send(s, job, 100.0)
    s.tick(100.0)
    s.tick(102.0)  # inside analysis_interval_s: no analysis
    send(s, job, 106.0)
    s.tick(106.0)
    [entry] = s.view.diagnosis.log.entries
    assert entry.decision.action.value == "hold" and "no free spare" in entry.decision.reason
    assert not s.view.hosts["h-r1-1"].cordoned
    # a spare arrives: the held finding is decided again and acted on
    s.register("s9", "i-s9", 110.0, spare=True)
    s.tick(111.0)
    assert s.view.diagnosis.log.entries[0].decision.action.value == "evict" and s.view.hosts["h-r1-1"].cordoned
    assert "(decided again)" in diagnoses(s)[-1].message


def test_dry_run_only_reports():
    s = cluster(dry_run=True)
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.no_progress(("r2", 0), waited_s=50.0, cross=True)
    send(s, job, 100.0)
    s.tick(100.0)
    [entry] = s.view.diagnosis.log.entries
    assert entry.decision.action.value == "dry_run" and "dry-run: would evict host h-r2-0" in entry.decision.reason
    assert not s.view.hosts["h-r2-0"].cordoned and s.take_orders() == [] and s.view.swaps == 0


def test_the_hourly_budget_holds_the_next_eviction_until_the_hour_passed():
    s = cluster(spares=("s0", "s1"), min_replicas=1, max_evictions_per_hour=1, hold_s=7200.0)
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(("r1", 1))
    send(s, job, 100.0)
    s.tick(100.0)
    assert s.view.hosts["h-r1-1"].cordoned
    job2 = Job(replicas=3, ranks=2, per_host=1, received_at=200.0)
    job2.never_joins(("r2", 0))
    for rk in [("r1", 0), ("r1", 1)]:
        del job2.views[rk]  # r1 is being rebuilt on the spare: it reports nothing yet
    send(s, job2, 200.0)
    s.tick(200.0)
    second = s.view.diagnosis.log.entries[-1]
    assert len(s.view.diagnosis.log.entries) == 2 and second.finding.hosts[0] == "h-r2-0"
    assert second.decision.action.value == "hold" and "1 eviction(s) in the last hour" in second.decision.reason
    s.tick(100.0 + 3599.0)
    assert not s.view.hosts["h-r2-0"].cordoned
    s.tick(100.0 + 3605.0)  # the next analysis tick after the hour
    assert s.view.diagnosis.log.entries[-1].decision.action.value == "evict" and s.view.hosts["h-r2-0"].cordoned


def test_never_below_min_replicas():
    s = cluster()
    s.report_dead("r0", "test", 50.0, host_id="h-r0-0")
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(("r1", 1))
    del job.views[("r0", 0)], job.views[("r0", 1)]
    send(s, job, 100.0)
    s.tick(100.0)
    [entry] = s.view.diagnosis.log.entries
    assert entry.decision.action.value == "hold" and "below min_replicas 2" in entry.decision.reason


def test_a_wait_on_a_restarted_process_names_nobody():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(("r1", 1))
    # r1/1 restarted 5 s ago: it reports no group yet, and cannot be in a collective 40 s old
    job.views[("r1", 1)] = replace(job.views[("r1", 1)], report=job.views[("r1", 1)].report._replace(
        recording_s=5.0, idle_s=5.0, groups=()))
    send(s, job, 100.0)
    s.tick(100.0)
    assert s.view.diagnosis.log.entries == []


def send_ftar_windows(s, job, now, start, marked=False):
    """Two FTAR windows per rank from `start`: r2/0 joins 2x later than its peers (`marked`: its
    windows say disturbed, as its checkpoint writes would)."""
    for rk, v in job.views.items():
        intra, cross = v.report.groups
        own = 2.0 if rk == ("r2", 0) else 1.0 + 0.01 * rk[1]
        ws = tuple(w._replace(disturbed=marked and rk == ("r2", 0)) for w in windows(own, own, start=start))
        job.set(rk, intra, cross._replace(windows=ws))
    send(s, job, now)


def test_stragglers_are_found_from_reported_windows_and_evicted():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    send_ftar_windows(s, job, 100.0, start=0)
    assert s.view.diagnosis.log.entries == []  # flagged twice, but the group was judged for 0 s (min span 5 s)
    send_ftar_windows(s, job, 106.0, start=2)
    [entry] = s.view.diagnosis.log.entries
    assert entry.finding.kind.value == "straggler" and entry.finding.hosts == ("h-r2-0",)
    assert "in 3 of its last 3 windows (windows 0..2, judged over 6.0 s)" in entry.finding.evidence[0]
    assert entry.decision.action.value == "evict" and s.view.hosts["h-r2-0"].cordoned


def test_windows_the_rank_marked_disturbed_are_reported_and_name_no_straggler():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    send_ftar_windows(s, job, 100.0, start=0, marked=True)  # 2x slow only in windows it marked disturbed
    send_ftar_windows(s, job, 106.0, start=2, marked=True)
    assert s.view.diagnosis.log.entries == [] and not s.view.hosts["h-r2-0"].cordoned
    bad = job.views[("r2", 0)].report
    cross = bad.groups[1]
    bad = bad._replace(groups=(bad.groups[0], cross._replace(windows=(cross.windows[0]._replace(disturbed=1),))))
    with pytest.raises(InvalidArgument, match="window 2: disturbed must be true or false, got 1"):
        s.telemetry(HostReport("h-r2-0", 4, (bad,)), secret("h-r2-0"), 107.0)


def test_sdc_by_rank_digests_is_evicted_after_the_second_incident():
    s = cluster()
    good = ("%016x" % 1, "%016x" % 2)
    for step in (1, 2):
        commit_round(s, step, 10.0 + step, **{rid: dict(
            digest=("bad0" if rid == "r1" else "5eed") * 8,
            rank_digests=(good[0], "deadbeefdeadbeef") if rid == "r1" else good) for rid in REPLICAS})
    first, second = s.view.diagnosis.log.entries
    assert first.finding.kind.value == "sdc" and first.finding.hosts == ("h-r1-1",)
    assert first.decision.action.value == "report" and "it is evicted after 2" in first.decision.reason
    assert second.finding.count == 2 and second.decision.action.value == "evict"
    assert s.view.hosts["h-r1-1"].cordoned and s.view.hosts["s0"].assignment == Assignment("r1", (1,), 2)


def test_an_sdc_verdict_decided_after_a_swap_names_the_host_that_held_the_state():
    """r1's bad digests of step 1 come in while r2's is awaited; meanwhile r1/1 moves from
    h-r1-1 onto the spare. The verdict is about the hosts that reported it, not the spare."""
    s = cluster()
    good = ("%016x" % 1, "%016x" % 2)
    q = commit_round(s, 1, 11.0, **{rid: dict(digest=("bad0" if rid == "r1" else "5eed") * 8,
                                             rank_digests=(good[0], "deadbeefdeadbeef") if rid == "r1" else good)
                                   for rid in ("r0", "r1")})
    assert not s.view.diagnosis.log.entries  # r2's digest of step 1 is still awaited
    s.drain("h-r1-1", 12.0)
    assert s.view.hosts["s0"].assignment == Assignment("r1", (1,), 2)
    s.report("r2", 1, 13.0, quorum_id=q.quorum_id, host_id="h-r2-0", digest="5eed" * 8, rank_digests=good)
    [incident] = s.view.diagnosis.log.entries
    assert incident.finding.kind.value == "sdc" and incident.finding.hosts == ("h-r1-1",)


def test_telemetry_from_strangers_and_bad_reports_change_nothing():
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    report = HostReport("h-r0-0", 4, (job.views[("r0", 0)].report,))
    with pytest.raises(PermissionDenied, match="host h-r0-0: the agent secret is wrong"):
        s.telemetry(report, "stolen", 100.0)
    with pytest.raises(PermissionDenied, match="the agent secret is missing"):
        s.telemetry(report, "", 100.0)
    with pytest.raises(PermissionDenied):  # another host's secret
        s.telemetry(report, secret("h-r1-0"), 100.0)
    with pytest.raises(NotFound):
        s.telemetry(report._replace(host_id="nobody"), "x", 100.0)
    with pytest.raises(InvalidArgument, match="window_collectives must be 1..4096"):
        s.telemetry(report._replace(window_collectives=0), secret("h-r0-0"), 100.0)
    bad = job.views[("r0", 0)].report._replace(idle_s=float("nan"))
    with pytest.raises(InvalidArgument, match="idle_s must be a finite number"):
        s.telemetry(report._replace(ranks=(bad,)), secret("h-r0-0"), 100.0)
    assert s.view.diagnosis.ranks == {} and s.view.diagnosis.reports == 0
    # a host may only speak for the ranks it runs
    other = job.views[("r1", 0)].report
    ignored = s.telemetry(report._replace(ranks=(job.views[("r0", 0)].report, other)),
                                 secret("h-r0-0"), 100.0)
    assert ignored == ["rank r1/0: host h-r0-0 does not run it"] and list(s.view.diagnosis.ranks) == [("r0", 0)]
    assert s.view.hosts["h-r0-0"].state == HostState.ACTIVE


#: a group's pending fields once nothing is pending (as the agent reports it)
NOTHING_PENDING = dict(pending_seq=-1, pending_s=0.0, pending_idle_s=0.0, pending_nbytes=0, pending_sent_bytes=0)


def test_a_hang_that_becomes_certain_is_reported_again_and_acted_on():
    """Every member joined an FTAR op and nobody sent a byte: three equal suspects (reported
    only); once the peers time out of it, the rank still in it is the one (evicted)."""
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.no_progress(("r2", 0), waited_s=40.0, cross=True)
    for rk in (("r0", 0), ("r1", 0)):  # no progress counters from FTAR: everyone at zero
        v = job.views[rk]
        job.set(rk, v.report.groups[0], v.report.groups[1]._replace(pending_sent_bytes=0))
    send(s, job, 100.0)
    s.tick(100.0)
    [first] = s.view.diagnosis.log.entries
    assert first.decision.action.value == "report" and len(first.finding.hosts) == 3
    for rk in [rk for rk in job.views if rk[0] != "r2"]:  # their FTAR ops timed out: r0 and r1 move on
        intra, cross = job.views[rk].report.groups
        job.set(rk, intra._replace(last_joined_seq=12, last_done_seq=12, **NOTHING_PENDING),
                cross._replace(last_joined_seq=21, last_done_seq=21, **NOTHING_PENDING))
    send(s, job, 105.0)
    s.tick(105.0)
    second = s.view.diagnosis.log.entries[-1]
    assert len(s.view.diagnosis.log.entries) == 2 and "joined without progress" in second.finding.summary
    assert second.finding.hosts == ("h-r2-0",) and second.decision.action.value == "evict"
    assert s.view.hosts["h-r2-0"].cordoned


def test_peers_still_stuck_after_an_eviction_do_not_blame_the_spare_that_took_the_rank():
    """Once r1/1's host is evicted (r1 declared dead), the other replicas stay in the same FTAR
    op until their timeout and keep reporting it; r1 rejoins from the spare, which has sent no
    telemetry yet. The collective began before r1's death: nobody there can be in it."""
    s = cluster()
    job = Job(replicas=3, ranks=2, per_host=1, received_at=100.0)
    job.never_joins(("r1", 1), waited_s=40.0)
    send(s, job, 100.0)
    s.tick(100.0)
    assert [e.decision.action.value for e in s.view.diagnosis.log.entries] == ["evict"]
    s.take_orders()
    s.join(JoinRequest("r1", 0, 2, incarnation="rebuilt", host_id="h-r1-0"), 101.0)
    assert s.view.replicas["r1"].state != ReplicaState.DEAD  # rebuilt: nothing excuses its ranks as down
    for rk in [rk for rk in job.views if rk[0] == "r1"]:
        del job.views[rk]  # its processes are new and report no group yet
    for rk in job.views:
        job.views[rk] = replace(job.views[rk], received_at=106.0)
    send(s, job, 106.0)
    s.tick(106.0)
    assert [e.finding.hosts[0] for e in s.view.diagnosis.log.entries] == ["h-r1-1"]
    assert not s.view.hosts["s0"].cordoned and s.view.hosts["s0"].assignment == Assignment("r1", (1,), 2)
