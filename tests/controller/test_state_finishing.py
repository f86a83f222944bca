"""FINISHED replicas and the COMPLETED job in the controller core driven by commands, on a fake clock."""

import copy
import re

import pytest

from controller.core.errors import FailedPrecondition, InvalidArgument, NotFound
from controller.core.model import Assignment, HostState, JobState, JoinRequest, ReplicaState
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored

SETTINGS = ControllerSettings(replicas=3, min_replicas=2, join_timeout_s=2.0, heartbeat_timeout_s=10.0)


def started(replicas=("r0", "r1", "r2")):
    """Hosts h<i> hold rank 0 of replica r<i>; every replica in a quorum at step 0, committed."""
    s = Driver(SETTINGS)
    for i, rid in enumerate(replicas):
        s.register(f"h{i}", f"i{i}", 0.0, assignment=Assignment(rid, (0,), 1))
        s.join(JoinRequest(rid, 0, 1, incarnation="one", host_id=f"h{i}"), 0.0)
    s.close_round(0.0)
    for i, rid in enumerate(replicas):
        s.report(rid, 0, 0.5, quorum_id=s.view.quorum.quorum_id, host_id=f"h{i}")
    return s


def advance(s, step, now, replicas=("r0", "r1", "r2")):
    """A quorum of `replicas` at `step` (their leaders on hosts h<i>); nobody reports it yet."""
    for i, rid in enumerate(replicas):
        s.join(JoinRequest(rid, step, 1, incarnation="one", host_id=f"h{i}"), now)
    return s.close_round(now)


def picture(s):
    return copy.deepcopy((*stored(s),
                          dict(s.view.round_joined), len(s.view.events)))


def kinds(s, kind):
    return [e for e in s.view.events if e.kind == kind]


def test_finished_replica_is_not_waited_for_nor_expired():
    s = started()
    assert s.finished("r0", 0, 1.0, reason="max_steps reached", host_id="h0") == JobState.RUNNING
    r0 = s.view.replicas["r0"]
    assert r0.state == ReplicaState.FINISHED and r0.reason == "finished after step 0: max_steps reached"
    for rid in ("r1", "r2"):
        s.join(JoinRequest(rid, 1, 1, incarnation="one", host_id=f"h{rid[1:]}"), 2.0)
    q = s.close_round(2.0)
    assert q.member_ids == {"r1", "r2"} and q.reason == "all 2 live replicas joined"
    s.beat_replicas(["r1", "r2"], 20.0)
    s.beat_hosts(["h0", "h1", "h2"], 20.0)
    s.tick(20.0)
    assert r0.state == ReplicaState.FINISHED and s.view.deaths == {}


def test_the_job_completes_when_every_replica_finished_or_died():
    s = started()
    s.finished("r0", 0, 1.0, host_id="h0")
    s.report_dead("r1", "GPU lost", 1.0, host_id="h1")
    assert s.view.job_state == JobState.RUNNING
    assert s.finished("r2", 0, 2.0, host_id="h2") == JobState.COMPLETED
    [event] = kinds(s, "job")
    assert event.message == 'job "job" COMPLETED: 2 replica(s) finished, 1 dead'
    assert s.view.completed_at == 2.0 and s.view.round_reason == "the job is COMPLETED"
    before = picture(s)
    for req in (JoinRequest("r1", 0, 1, incarnation="two", host_id="h1"), JoinRequest("r9", 0, 1),
                JoinRequest("r0", 1, 1, incarnation="two", host_id="h0")):
        with pytest.raises(FailedPrecondition, match='job "job" is COMPLETED'):
            s.join(req, 3.0)
    assert picture(s) == before
    assert s.finished("r2", 0, 4.0, host_id="h2") == JobState.COMPLETED  # said again: nothing new
    assert len(kinds(s, "job")) == 1


def test_all_dead_is_not_completed():
    s = started()
    for rid in ("r0", "r1", "r2"):
        s.report_dead(rid, "gone", 1.0, host_id=f"h{rid[1:]}")
    assert s.view.job_state == JobState.RUNNING and s.view.completed_at is None


def test_a_completed_job_survives_a_failover_and_its_silent_agents_are_no_failure():
    s = started()
    for rid in ("r0", "r1", "r2"):
        s.finished(rid, 0, 1.0, host_id=f"h{rid[1:]}")
    t = Driver.restored(SETTINGS, *stored(s), 5.0)
    assert t.view.job_state == JobState.COMPLETED and t.view.replicas["r1"].state == ReplicaState.FINISHED
    t.tick(100.0)
    assert {h.state for h in t.view.hosts.values()} == {HostState.ACTIVE} and not t.take_orders()


def test_a_new_incarnation_of_a_finished_replica_trains_again_while_the_job_runs():
    s = started()
    s.finished("r0", 0, 1.0, host_id="h0")
    with pytest.raises(FailedPrecondition, match="only a new process"):
        s.join(JoinRequest("r0", 1, 1, incarnation="one", host_id="h0"), 2.0)
    s.join(JoinRequest("r0", 0, 1, incarnation="two", host_id="h0"), 2.0)
    r0 = s.view.replicas["r0"]
    assert r0.state == ReplicaState.JOINING and "trains again after it finished" in r0.reason
    assert s.view.deaths == {}  # finishing and coming back is no death
    for rid in ("r1", "r2"):
        s.join(JoinRequest(rid, 1, 1, incarnation="one", host_id=f"h{rid[1:]}"), 2.0)
    q = s.close_round(2.0)
    assert q.member_ids == {"r0", "r1", "r2"} and q.recover == {"r0": ("r1", "r2")}


def test_trainer_exit_0_after_finishing_is_a_normal_end():
    s = started()
    s.finished("r0", 0, 1.0, host_id="h0")
    for rank_exit in range(2):  # two ranks' exits: one event for the replica
        s.exit("h0", "r0", 0, 1.5 + rank_exit, exit_code=0)
    [event] = kinds(s, "finished")
    assert event.message == "replica r0 finished: trainer rank 0 on host h0 exited with code 0"
    assert s.view.replicas["r0"].state == ReplicaState.FINISHED and s.view.deaths == {}
    s.exit("h0", "r0", 0, 2.0, exit_code=1, stderr_tail="teardown failed")
    assert s.view.replicas["r0"].state == ReplicaState.FINISHED  # its work is done: no death


def test_trainer_exit_0_before_finishing_is_a_death():
    s = started()
    s.exit("h1", "r1", 0, 1.0, exit_code=0)
    r1 = s.view.replicas["r1"]
    assert r1.state == ReplicaState.DEAD and s.view.deaths == {"trainer_exit": 1}
    assert r1.reason == "trainer rank 0 on host h1 exited cleanly before its replica finished"
    assert s.finished("r1", 0, 1.2, host_id="h1") == JobState.RUNNING  # its leader's report came last
    assert r1.state == ReplicaState.FINISHED


def test_a_lost_step_report_is_made_good_by_the_finish():
    s = started()
    for step in range(1, 8):  # quorums up to step 7, whose commit reports were all lost
        advance(s, step, 0.6)
    s.finished("r0", 7, 1.0, host_id="h0")
    assert (s.view.replicas["r0"].committed_step, s.view.max_committed_step) == (7, 7)


def test_a_finish_after_a_step_no_quorum_gave_is_refused():
    s = started()
    before = picture(s)
    with pytest.raises(FailedPrecondition, match=f"finished at step {10**15}, but no quorum gave it a step after 0"):
        s.finished("r0", 10**15, 1.0, host_id="h0")
    assert picture(s) == before


def test_a_long_finish_reason_is_cut_with_a_marker():
    s = started()
    s.finished("r0", 0, 1.0, host_id="h0", reason="x" * 5000)
    assert "more characters cut]" in s.view.replicas["r0"].reason and len(s.view.replicas["r0"].reason) < 300


@pytest.mark.parametrize("rid, step, host, reason, error, message", [
    ("ghost", 3, "", "", FailedPrecondition, "replica 'ghost' is unknown"),
    ("r 0", 3, "", "", InvalidArgument, "must start with a letter or digit"),
    ("r0", -2, "h0", "", InvalidArgument, "step must be -1 (nothing committed) or more, got -2."),
    ("r0", 2, "h0", "", FailedPrecondition, "finished at step 2, but it already committed step 3"),
    ("r0", 3, "h1", "", FailedPrecondition, "host h1 does not hold rank 0 of replica r0"),
    ("r0", 3, "", "", FailedPrecondition, "r0's coordinator named no host_id, but host h0 holds its rank 0"),
    ("r0", 4, "h0", "", FailedPrecondition, "finished at step 4, but no quorum gave it a step after 3"),
])
def test_bad_finish_reports_are_refused_and_change_nothing(rid, step, host, reason, error, message):
    s = started()
    for k in (1, 2):  # the history a quorum for step 3 needs (controller.core.admission)
        advance(s, k, 0.6)
        for i, rid_ in enumerate(("r0", "r1", "r2")):
            s.report(rid_, k, 0.6, quorum_id=s.view.quorum.quorum_id, host_id=f"h{i}")
    advance(s, 3, 0.6)
    s.report("r0", 3, 0.7, quorum_id=s.view.quorum.quorum_id, host_id="h0")
    before = picture(s)
    with pytest.raises(error, match=re.escape(message)):
        s.finished(rid, step, 1.0, host_id=host, reason=reason)
    assert picture(s) == before


def test_trainer_exit_of_an_unknown_host_is_refused():
    s = started()
    with pytest.raises(NotFound):
        s.exit("h9", "r0", 0, 1.0, exit_code=0)


def test_a_replica_restarted_after_the_others_finished_ends_the_job_and_does_not_rejoin_it():
    """Issue 39, finding 4 (torchrun --max-restarts): r1's rank restarts just before the end and
    its new process joins while r0 and r2 have finished. Its old process's death completes the
    job at that join; the new process is not left JOINING in a COMPLETED job, waiting for a
    round that never closes: it stays DEAD and is not in the round (the shell refuses its join
    at once), and any later join is refused as COMPLETED."""
    s = started()
    s.finished("r0", 0, 1.0, host_id="h0")
    s.finished("r2", 0, 1.0, host_id="h2")
    assert s.view.job_state == JobState.RUNNING  # r1's old process still counts as live
    s.join(JoinRequest("r1", 0, 1, incarnation="restarted", host_id="h1"), 2.0)
    assert s.view.job_state == JobState.COMPLETED
    r1 = s.view.replicas["r1"]
    assert r1.state == ReplicaState.DEAD and "its coordinator restarted" in r1.reason
    assert "r1" not in s.view.round_joined and s.view.round_reason == "the job is COMPLETED"
    assert s.view.join_refusal("r1").startswith('job "job" is COMPLETED')
    with pytest.raises(FailedPrecondition, match="job \"job\" is COMPLETED"):
        s.join(JoinRequest("r1", 0, 1, incarnation="restarted", host_id="h1"), 3.0)


def test_the_end_of_the_job_empties_the_open_round():
    s = started()
    s.join(JoinRequest("r1", 1, 1, incarnation="one", host_id="h1"), 2.0)
    assert "r1" in s.view.round_joined
    s.finished("r0", 0, 3.0, host_id="h0")
    s.report_dead("r1", "GPU lost", 3.0, host_id="h1")
    s.finished("r2", 0, 3.0, host_id="h2")
    assert s.view.job_state == JobState.COMPLETED and dict(s.view.round_joined) == {}
