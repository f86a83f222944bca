"""Rollback is a last resort, and loud: the pure rule, then rounds on a fake clock."""

import pytest

from controller.core.errors import InvalidArgument
from controller.core.model import JoinRequest, ReplicaState
from controller.core.rollback import check_rollback
from controller.service.quorum_answer import QuorumAnswers
from controller.settings import ControllerSettings
from tests.controller.drive import Driver

WAIT = 20.0


def rule(members, history=51, holders=None, checkpoint=-1, since=None, now=100.0, alive_until=None):
    return check_rollback(members, history_step=history, holders=holders or {}, newest_checkpoint_step=checkpoint,
                          waiting_since=since, now=now, wait_s=WAIT, alive_until=alive_until)


def test_the_rule_in_order():
    # 1. A member continues the history.
    assert rule({"r0": 52, "r1": 0}) is None
    # 2. A holder of the newest step may come back: wait, until the bound.
    d = rule({"r0": 0}, holders={"r2": 51})
    assert d.wait and d.wake_at == 120.0 and "r2 (which committed step 51)" in d.reason
    assert rule({"r0": 0}, holders={"r2": 51}, since=90.0, now=109.9).wait
    # 3. The wait is over, or nobody holds it: roll back, and say how much is lost.
    d = rule({"r0": 0}, holders={"r2": 51}, since=90.0, now=110.0)
    assert not d.wait and d.steps_lost == 52 and d.resume_checkpoint_step is None
    assert "ROLLBACK: the job had committed step 51" in d.reason and "r2 did not come back within 20s" in d.reason
    d = rule({"r0": 3, "r1": 2})
    assert not d.wait and d.steps_lost == 49 and "no replica that committed it is left" in d.reason
    # ...from the newest durable checkpoint when it is newer than what the members hold.
    d = rule({"r0": 3}, checkpoint=40)
    assert d.resume_checkpoint_step == 40 and d.steps_lost == 11 and "checkpoint of step 40" in d.reason
    assert rule({"r0": 41}, checkpoint=40).resume_checkpoint_step is None  # members hold step 40 already


def job(checkpoint: bool = True):
    s = Driver(ControllerSettings(replicas=3, min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=10.0,
                                           rollback_wait_s=WAIT))
    for step in range(52):  # three replicas commit steps 0..51, checkpointing step 40 (or not)
        round_(s, {"r0": step, "r1": step, "r2": step}, 1.0)
        for rid in ("r0", "r1", "r2"):
            commit(s, rid, 1.0, checkpoint_step=40 if checkpoint and step >= 40 else None)
    return s


def round_(s, steps, now, incarnation="a"):
    for rid, step in steps.items():
        s.join(JoinRequest(rid, step, 1, incarnation=f"{rid}-{incarnation}"), now)
    return s.close_round(now)


def commit(s, rid, now, **kw):
    """Report the commit of what `rid` was last given (its quorum and step)."""
    r = s.view.replicas[rid]
    s.report(rid, r.given_step, now, quorum_id=r.given_quorum_id, **kw)


def lose_r2_then_restart_r0_r1(s):
    """The issue's case: r2 (which holds step 51) is stopped and declared dead; r0 and r1
    come back as new processes at step 0."""
    s.report_dead("r2", "silent", 2.0)
    return round_(s, {"r0": 0, "r1": 0}, 3.0, incarnation="b")


def test_a_round_waits_for_the_replica_that_holds_the_newest_step_and_it_wins():
    s = job()
    assert lose_r2_then_restart_r0_r1(s) is None
    assert s.view.round_wake_at == 3.0 + WAIT and "waiting up to 20s more for r2" in s.view.round_reason
    assert [e.kind for e in s.view.events].count("rollback_wait") == 1
    assert s.close_round(10.0) is None  # still waiting, one event only
    assert [e.kind for e in s.view.events].count("rollback_wait") == 1
    s.join(JoinRequest("r2", 52, 1, incarnation="r2-a"), 12.0)  # r2 was only stopped: it comes back
    q = s.close_round(12.0)
    assert q.max_step == 52 and {m.replica_id: m.healthy for m in q.members} == {"r0": False, "r1": False, "r2": True}
    assert "ROLLBACK" not in q.reason and s.view.steps_lost == {}
    assert not [e for e in s.view.events if e.kind in ("rollback", "roll_forward")]


def test_without_the_holder_it_rolls_back_loudly_then_a_returning_holder_rolls_it_forward():
    s = job(checkpoint=False)  # no durable checkpoint: back to step 0
    assert lose_r2_then_restart_r0_r1(s) is None
    q = s.close_round(3.0 + WAIT)
    assert q.max_step == 0 and q.resume_checkpoint_step is None and "ROLLBACK" in q.reason
    [rollback] = [e for e in s.view.events if e.kind == "rollback"]
    assert "the job had committed step 51, training resumes at step 0 (52 committed steps lost" in rollback.message
    assert s.view.steps_lost == {"rollback": 52} and s.view.history_step == -1
    # The new history commits steps 0 and 1; rounds on it are no rollbacks.
    for step in (0, 1):
        commit(s, "r0", 30.0)
        commit(s, "r1", 30.0)
        q = round_(s, {"r0": step + 1, "r1": step + 1}, 31.0, incarnation="b")
        assert "ROLLBACK" not in q.reason
    # r2 was only stopped: it comes back with step 51, and its newer state wins.
    commit(s, "r2", 32.0)  # a late report of step 51, from the old history, extends nothing
    assert s.view.history_step == 1
    s.join(JoinRequest("r2", 52, 1, incarnation="r2-a"), 33.0)
    q = round_(s, {"r0": 2, "r1": 2}, 33.0, incarnation="b")
    assert q.max_step == 52 and [m.replica_id for m in q.members if m.healthy] == ["r2"]
    [forward] = [e for e in s.view.events if e.kind == "roll_forward"]
    assert "rolls forward from step 1 to step 51: r2 came back with it; 2 steps committed" in forward.message
    assert s.view.steps_lost == {"rollback": 52, "abandoned": 2} and s.view.history_step == 51
    assert s.view.history_changes == {"rollback": 1, "roll_forward": 1}
    assert {r.history_epoch for r in s.view.replicas.values()} == {s.view.history_epoch}


def test_a_rollback_offers_the_newest_durable_checkpoint():
    s = job()
    assert s.view.newest_checkpoint_step == 40
    lose_r2_then_restart_r0_r1(s)
    q = s.close_round(3.0 + WAIT)
    assert q.resume_checkpoint_step == 40 and q.max_step == 0 and s.view.steps_lost == {"rollback": 11}
    answers = QuorumAnswers()
    answers.prepare(q, s.view)
    answer = answers.get(0)
    assert answer.HasField("resume_checkpoint_step") and answer.resume_checkpoint_step == 40
    # A member that loads it joins at step 41 next and commits it: the history continues from there.
    round_(s, {"r0": 41, "r1": 0}, 30.0, incarnation="b")
    commit(s, "r0", 30.0)
    q = round_(s, {"r0": 42, "r1": 0}, 31.0, incarnation="b")
    assert "ROLLBACK" not in q.reason and q.max_step == 42


def test_a_checkpoint_step_past_the_committed_step_is_refused_and_changes_nothing():
    s = job()
    before = s.view.snapshot_replicas()
    with pytest.raises(InvalidArgument, match="checkpoint_step must be between 0 and the committed step 52, got 53"):
        s.report("r0", 52, 5.0, quorum_id=s.view.quorum.quorum_id, checkpoint_step=53)
    with pytest.raises(InvalidArgument, match="got -1"):
        s.report("r0", 52, 5.0, quorum_id=s.view.quorum.quorum_id, checkpoint_step=-1)
    assert s.view.snapshot_replicas() == before and s.view.replicas["r0"].state == ReplicaState.HEALTHY


def test_history_survives_a_takeover():
    s = job()
    lose_r2_then_restart_r0_r1(s)
    s.close_round(3.0 + WAIT)
    t = Driver.restored(s.settings, s.view.snapshot_replicas(), [], 40.0)
    assert (t.view.history_step, t.view.history_epoch, t.view.branch_start_step, t.view.newest_checkpoint_step, t.view.steps_lost) == \
        (s.view.history_step, s.view.history_epoch, s.view.branch_start_step, 40, {"rollback": 11})


def test_the_rule_waits_for_a_live_holder_past_the_wait_until_its_heartbeat_timeout():
    # r2 beat last at 125 with a 10 s timeout: alive until 135, past the wait's end at 120.
    d = rule({"r0": 0}, holders={"r2": 51}, since=100.0, now=121.0, alive_until={"r2": 135.0})
    assert d.wait and d.wake_at == 135.0 and "r2 still heartbeats" in d.reason
    d = rule({"r0": 0}, holders={"r2": 51}, since=100.0, now=135.0, alive_until={"r2": 135.0})
    assert not d.wait and "ROLLBACK" in d.reason  # silent for its whole timeout: no sign of life left
    assert rule({"r0": 0}, holders={"r2": 51}, since=100.0, now=121.0, alive_until={"r9": 200.0}).wait is False  # not a holder


def slow_live_holder(s):
    """The demo's failure under load: r0 and r1 come back as new processes at step 0 while r2,
    which holds step 51, is slow (it does not join in time) but alive: it heartbeats."""
    s.beat_replicas(["r2"], 2.0)
    assert round_(s, {"r0": 0, "r1": 0}, 3.0, incarnation="b") is None  # the join timeout: r2 is live
    return s.close_round(4.5)  # the round would close without r2 now: the rollback wait starts


def test_a_slow_but_live_holder_of_the_newest_step_is_never_rolled_back_past():
    s = job()
    assert slow_live_holder(s) is None
    assert s.view.round_wake_at == 4.5 + WAIT
    for now in (4.5 + WAIT, 30.0, 45.0):  # past rollback_wait_s: r2 keeps heartbeating
        s.beat_replicas(["r2"], now - 1.0)
        assert s.close_round(now) is None, s.view.round_reason
        assert "r2 still heartbeats" in s.view.round_reason and s.view.round_wake_at == now - 1.0 + 10.0
    assert not [e for e in s.view.events if e.kind == "rollback"]
    s.join(JoinRequest("r2", 52, 1, incarnation="r2-a"), 46.0)  # it was only slow
    q = s.close_round(46.0)
    assert q.max_step == 52 and "ROLLBACK" not in q.reason and s.view.steps_lost == {}


def test_a_holder_that_falls_silent_is_waited_for_its_heartbeat_timeout_from_its_last_beat():
    s = job()
    assert slow_live_holder(s) is None
    s.beat_replicas(["r2"], 30.0)  # its last sign of life
    assert s.close_round(39.9) is None
    q = s.close_round(40.0)  # 30 + the 10 s heartbeat timeout; the wait itself ended at 24.5
    assert q is not None and "ROLLBACK" in q.reason


def test_survivors_a_few_ms_apart_close_together_after_a_lone_waiter():
    """Race 7 of issue 28: r1 restarted and waits alone in the round (1 of 3 is no majority);
    r0 and r2, the survivors, come 10 s later and 5 ms apart. The round used to close the
    moment r0 arrived (its join timeout counted from r1), leaving r2 to catch up a step."""
    s = Driver(ControllerSettings(replicas=3, min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=30.0))
    round_(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    for rid in ("r0", "r1", "r2"):
        commit(s, rid, 0.5)
    s.join(JoinRequest("r1", 1, 1, incarnation="r1-new"), 1.0)  # restarted: it waits alone
    assert s.close_round(1.0) is None
    s.beat_replicas(["r0", "r2"], 11.0)
    s.join(JoinRequest("r0", 1, 1, incarnation="r0-a"), 11.0)
    assert s.close_round(11.0) is None  # a majority, but it just became one: a moment for r2
    s.join(JoinRequest("r2", 1, 1, incarnation="r2-a"), 11.005)
    q = s.close_round(11.005)
    assert q is not None and q.member_ids == {"r0", "r1", "r2"}
