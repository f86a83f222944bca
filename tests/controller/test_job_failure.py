"""The FAILED job: no replica can make progress for fail_after_s. Pure rule + core commands, fake clock."""

import copy

import pytest

from controller.core.errors import FailedPrecondition
from controller.core.job_failure import ReplicaOutlook, crash_loop_cause, failure_decision, stuck_reason
from controller.core.model import Assignment, JobState, JoinRequest, ReplicaState
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored

SETTINGS = ControllerSettings(replicas=2, min_replicas=1, join_timeout_s=2.0, heartbeat_timeout_s=10.0,
                              restart_budget=1, restart_window_s=100.0, fail_after_s=5.0)


@pytest.mark.parametrize("outlooks, spares, stuck", [
    ([], 0, False),                                                                     # nothing yet
    ([ReplicaOutlook("r0", True, "h0"), ReplicaOutlook("r1", False, "")], 0, False),   # r1 lives
    ([ReplicaOutlook("r0", True, "h0"), ReplicaOutlook("r1", True, "")], 0, False),    # r1 restarts
    ([ReplicaOutlook("r0", True, "h0"), ReplicaOutlook("r1", True, "h1")], 1, False),  # a spare is free
    ([ReplicaOutlook("r0", True, "h0"), ReplicaOutlook("r1", True, "h1")], 0, True),
])
def test_stuck_rule_table(outlooks, spares, stuck):
    reason = stuck_reason(outlooks, spares, 2)
    assert bool(reason) == stuck
    if stuck:
        assert reason == ("no replica can make progress: all 2 are DEAD and wait on hosts that cannot run "
                          "(r0 on host h0, r1 on host h1), and no spare is free")


def test_a_job_still_missing_configured_replicas_is_not_stuck():
    assert not stuck_reason([ReplicaOutlook("r0", True, "h0")], 0, 2)
    assert stuck_reason([ReplicaOutlook("r0", True, "h0")], 0, 1)


def test_failure_decision_counts_from_the_first_stuck_moment():
    assert failure_decision("", 3.0, 10.0, 5.0) == (failure_decision("", None, 0.0, 5.0))
    first = failure_decision("x", None, 10.0, 5.0)
    assert (first.stuck_since, first.fail) == (10.0, False) and "FAILS in 5.0s" in first.reason
    assert not failure_decision("x", 10.0, 14.9, 5.0).fail
    done = failure_decision("x", 10.0, 15.0, 5.0)
    assert done.fail and done.reason == "x for 5.0s (fail_after_s 5)"


CAUSE = "exit code 1: RuntimeError: config file train.yaml not found"


@pytest.mark.parametrize("outlooks, committed_any, cause", [
    ([ReplicaOutlook("r0", True, "h0", CAUSE), ReplicaOutlook("r1", True, "h1", CAUSE)], False, CAUSE),
    ([ReplicaOutlook("r0", True, "h0", CAUSE), ReplicaOutlook("r1", True, "h1", CAUSE)], True, ""),   # it trained
    ([ReplicaOutlook("r0", True, "h0", CAUSE), ReplicaOutlook("r1", True, "h1", "signal 9")], False, ""),  # two causes
    ([ReplicaOutlook("r0", True, "h0", CAUSE), ReplicaOutlook("r1", True, "h1", "")], False, ""),  # r1's host died
    ([ReplicaOutlook("r0", True, "h0", "signal 9")], False, "signal 9"),
    ([], False, ""),
])
def test_crash_loop_rule_table(outlooks, committed_any, cause):
    assert crash_loop_cause(outlooks, committed_any) == cause


@pytest.mark.parametrize("crash, now, fail", [
    ("", 10.0, False),      # no crash loop: fail_after_s from the first stuck moment
    ("", 15.0, True),
    (CAUSE, 10.0, True),    # a crash loop fails the moment the job is stuck
])
def test_failure_decision_on_a_fake_clock(crash, now, fail):
    decision = failure_decision("stuck", 10.0 if now > 10.0 else None, now, 5.0, crash)
    assert decision.fail == fail and decision.stuck_since == 10.0
    if crash:
        assert decision.reason == (f"crash loop before any committed step: every replica's trainers died of the same "
                                   f"cause ({CAUSE}) until their restart budgets were spent; stuck")


def test_fail_after_s_is_validated():
    with pytest.raises(ValueError, match="fail_after_s must be a positive number of seconds, got 0"):
        ControllerSettings(fail_after_s=0).validate()


def crash_looping(settings=SETTINGS, *, committed=True, join=True, tails=("RuntimeError: CUDA error",) * 2):
    """Hosts h0, h1 run r0, r1; both replicas joined (`join`) and committed step 0
    (`committed`), then every trainer death crash-loops (r{i}'s stderr ends with `tails[i]`)
    until the restart budget is spent and both hosts are cordoned without a spare."""
    s = Driver(settings)
    for i in range(2):
        s.register(f"h{i}", f"i{i}", 0.0, assignment=Assignment(f"r{i}", (0,), 1))
        if join:
            s.join(JoinRequest(f"r{i}", 0, 1, incarnation="one", host_id=f"h{i}"), 0.0)
    q = s.close_round(0.0)
    if committed:
        for i in range(2):
            s.report(f"r{i}", 0, 0.5, quorum_id=q.quorum_id, host_id=f"h{i}")
    for t in (1.0, 2.0):
        for i in range(2):
            s.exit(f"h{i}", f"r{i}", 0, t, exit_code=1, stderr_tail=f"Traceback\n{tails[i]}\n",
                           version=s.view.hosts[f"h{i}"].assignment_version)
    return s


def beat(s, now):
    s.beat_hosts(list(s.view.hosts), now)


def test_a_crash_looping_job_without_spares_fails_after_fail_after_s():
    s = crash_looping()
    assert {r.state for r in s.view.replicas.values()} == {ReplicaState.DEAD}
    assert all(h.cordoned for h in s.view.hosts.values())
    beat(s, 3.0)
    s.tick(3.0)
    assert s.view.job_state == JobState.RUNNING and s.view.stuck_since == 3.0
    [stuck] = [e for e in s.view.events if e.kind == "job_stuck"]
    assert "no replica can make progress" in stuck.message and "FAILS in 5.0s" in stuck.message
    assert s.view.job_state_reason.startswith("no replica can make progress")
    beat(s, 7.9)
    s.tick(7.9)
    assert s.view.job_state == JobState.RUNNING
    beat(s, 8.0)
    s.tick(8.0)
    assert s.view.job_state == JobState.FAILED and s.view.failed_at == 8.0
    assert s.view.job_state_reason == ("no replica can make progress: all 2 are DEAD and wait on hosts that cannot run "
                                  "(r0 on host h0, r1 on host h1), and no spare is free for 5.0s (fail_after_s 5)")
    [failed] = [e for e in s.view.events if e.kind == "job_failed"]
    assert failed.level == "error" and failed.message == f'job "job" FAILED: {s.view.job_state_reason}'
    assert s.view.round_reason == "the job is FAILED" and s.close_round(9.0) is None
    # final: a join is refused, naming the state and the reason; nothing changes
    before = copy.deepcopy(s.view.snapshot_replicas())
    with pytest.raises(FailedPrecondition, match=r'job "job" is FAILED: no replica can make progress.*may not join'):
        s.join(JoinRequest("r0", 0, 1, incarnation="two", host_id="h0"), 9.0)
    assert s.view.snapshot_replicas() == before
    # a spare arriving now changes nothing: FAILED is final
    s.register("h9", "i9", 9.5, spare=True)
    s.tick(10.0)
    assert s.view.job_state == JobState.FAILED and s.view.failed_at == 8.0


def test_a_spare_in_time_lifts_the_stuck_job():
    s = crash_looping()
    beat(s, 3.0)
    s.tick(3.0)
    assert s.view.stuck_since == 3.0
    s.register("h9", "i9", 4.0, spare=True)  # takes one cordoned host's work
    beat(s, 9.0)
    s.tick(9.0)
    assert s.view.job_state == JobState.RUNNING and s.view.stuck_since is None and s.view.job_state_reason == ""


def test_a_dead_replica_whose_hosts_can_run_is_not_stuck():
    s = crash_looping(ControllerSettings(**{**SETTINGS.__dict__, "restart_budget": 10}))
    for now in (3.0, 12.0, 20.0):
        beat(s, now)
        s.tick(now)
    assert s.view.job_state == JobState.RUNNING and s.view.stuck_since is None


def test_failed_survives_a_failover_with_its_reason():
    s = crash_looping()
    beat(s, 3.0)
    s.tick(3.0)
    beat(s, 8.0)
    s.tick(8.0)
    t = Driver.restored(SETTINGS, *stored(s), 50.0)
    assert t.view.job_state == JobState.FAILED and t.view.failed_at == 8.0 and t.view.job_state_reason == s.view.job_state_reason
    t.tick(100.0)  # the failed job's silent agents are no failure
    assert not [e for e in t.view.events if e.kind == "host_death"] and t.view.job_state == JobState.FAILED


def test_completed_has_a_reason_too():
    s = Driver(SETTINGS)
    for i in range(2):
        s.register(f"h{i}", f"i{i}", 0.0, assignment=Assignment(f"r{i}", (0,), 1))
        s.join(JoinRequest(f"r{i}", 0, 1, incarnation="one", host_id=f"h{i}"), 0.0)
    s.close_round(0.0)
    s.finished("r0", -1, 1.0, host_id="h0")
    s.report_dead("r1", "gone", 1.0, host_id="h1")
    assert s.view.job_state == JobState.COMPLETED and s.view.job_state_reason == "1 replica(s) finished, 1 dead"
    s.tick(100.0)
    assert s.view.job_state == JobState.COMPLETED and s.view.failed_at is None


@pytest.mark.parametrize("join", [True, False])  # False: the trainers die before their first join
def test_a_crash_loop_before_any_committed_step_fails_at_the_first_tick_naming_its_cause(join):
    s = crash_looping(committed=False, join=join, tails=("RuntimeError: config file train.yaml not found",) * 2)
    assert s.view.job_state == JobState.RUNNING  # the budgets are spent; the tick decides
    beat(s, 2.5)
    s.tick(2.5)
    assert s.view.job_state == JobState.FAILED and s.view.failed_at == 2.5
    assert s.view.job_state_reason.startswith(
        f"crash loop before any committed step: every replica's trainers died of the same cause ({CAUSE}) until "
        f"their restart budgets were spent; no replica can make progress: all 2 are DEAD")
    assert not [e for e in s.view.events if e.kind == "job_stuck"]  # no FAILING countdown: it failed at once
    [failed] = [e for e in s.view.events if e.kind == "job_failed"]
    assert CAUSE in failed.message


def test_a_crash_loop_of_different_causes_waits_fail_after_s():
    s = crash_looping(committed=False, tails=("RuntimeError: CUDA error", "OSError: disk full"))
    beat(s, 3.0)
    s.tick(3.0)
    assert s.view.job_state == JobState.RUNNING and s.view.failing_since == 3.0
    beat(s, 8.0)
    s.tick(8.0)
    assert s.view.job_state == JobState.FAILED and "crash loop" not in s.view.job_state_reason
