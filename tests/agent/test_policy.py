"""Table tests for the pure decisions: next_action and the restart budget window."""

from __future__ import annotations

import random

import pytest

from agent.policy import (ActionKind, Observed, Placement, Proc, RestartBudget, Role, Spec, Want,
                          is_finishing, keep_trainers_past_timeout, next_action, restarts_in_window)

A = ActionKind
R0 = Placement("r0", 0, 2, rendezvous="10.0.0.1:29500", coordinator="10.0.0.1:29501")
TRAIN = Want(Role.TRAIN, 1, R0)
OTHER = Want(Role.TRAIN, 1, Placement("r1", 0, 2))
MOVED = Want(Role.TRAIN, 1, Placement("r0", 0, 2, rendezvous="10.0.0.9:29500", coordinator="10.0.0.9:29501"))
STANDBY = Want(Role.STANDBY, 1)
IDLE = Want(Role.IDLE, 1)
BUDGET = RestartBudget(restarts=2, window_s=60.0)


def proc(role=Role.TRAIN, gen=1, placement=R0, exited=False, code=None, sig=None):
    return Proc(role, gen, placement if role is Role.TRAIN else None, 0, exited, code, sig)


KILLED = proc(exited=True, sig=9)
STANDBY_KILLED = proc(Role.STANDBY, exited=True, sig=9)

CASES = [
    # (name, proc, want, restart times, halted generation, expected action, words in reason)
    ("empty slot, trainer wanted", None, TRAIN, (), None, A.START, "replica r0 rank 0"),
    ("empty slot, standby wanted", None, STANDBY, (), None, A.START, "standby"),
    ("empty slot, nothing wanted", None, IDLE, (), None, A.WAIT, "idle"),
    ("halted at this generation", None, TRAIN, (), 1, A.WAIT, "halted"),
    ("halted at an older generation", None, TRAIN, (), 0, A.START, "starting"),
    ("trainer running as wanted", proc(), TRAIN, (), None, A.WAIT, "running"),
    ("standby running as wanted", proc(Role.STANDBY), STANDBY, (), None, A.WAIT, "standby"),
    ("standby + assignment", proc(Role.STANDBY), TRAIN, (), None, A.SWAP_IN, "takes replica r0"),
    ("its replica halted", proc(), TRAIN, (), 1, A.STOP, "another rank of its replica died"),
    ("its replica meets elsewhere now", proc(), MOVED, (), None, A.STOP, "placement changed"),
    ("running, nothing wanted", proc(), IDLE, (), None, A.STOP, "no trainer"),
    ("standby running, nothing wanted", proc(Role.STANDBY), IDLE, (), None, A.STOP, "no trainer"),
    ("trainer running, released", proc(), STANDBY, (), None, A.STOP, "released"),
    ("other assignment", proc(), OTHER, (), None, A.STOP, "changed to replica r1"),
    ("restart ordered", proc(gen=0), TRAIN, (), None, A.STOP, "generation 1"),
    # A trainer is never restarted alone, whatever the budget: its replica restarts as a unit.
    ("trainer killed", KILLED, TRAIN, (), None, A.HALT_REPLICA, "signal 9; its replica waits"),
    ("trainer killed, restarts used", KILLED, TRAIN, (50.0, 90.0), None, A.HALT_REPLICA, "controller"),
    ("exit code 3", proc(exited=True, code=3), TRAIN, (), None, A.HALT_REPLICA, "code 3"),
    ("exit code 0 finished", proc(exited=True, code=0), TRAIN, (), None, A.WAIT, "finished"),
    ("standby died", proc(Role.STANDBY, exited=True, code=1), STANDBY, (), None, A.RESTART,
     "standby trainer exited"),
    ("standby killed, one restart used", STANDBY_KILLED, STANDBY, (50.0,), None, A.RESTART, "1 of 2"),
    ("standby killed, budget spent", STANDBY_KILLED, STANDBY, (50.0, 90.0), None, A.GIVE_UP,
     "budget exhausted"),
    ("standby killed, old restarts left window", STANDBY_KILLED, STANDBY, (10.0, 39.9), None, A.RESTART,
     "0 of 2"),
    ("exited, no longer wanted", KILLED, IDLE, (), None, A.WAIT, "no longer wanted"),
    ("exited, older generation", proc(gen=0, exited=True, sig=9), TRAIN, (), None, A.WAIT,
     "no longer wanted"),
]


@pytest.mark.parametrize("name,p,want,times,halted,kind,words", CASES, ids=[c[0] for c in CASES])
def test_next_action(name, p, want, times, halted, kind, words):
    action = next_action(Observed(100.0, p, times, halted), Spec(want, BUDGET))
    assert action.kind is kind, action.reason
    assert words in action.reason


def test_every_action_kind_is_covered_by_the_table():
    seen = {next_action(Observed(100.0, c[1], c[3], c[4]), Spec(c[2], BUDGET)).kind
            for c in CASES}
    assert seen == set(ActionKind)


def test_zero_budget_gives_a_standby_up_at_the_first_exit():
    action = next_action(Observed(0.0, STANDBY_KILLED), Spec(STANDBY, RestartBudget(0, 60.0)))
    assert action.kind is A.GIVE_UP
    assert "0 of 0" in action.reason


def test_budget_window_moves_with_the_clock():
    """Three standby exits in quick succession spend a budget of 2; once the window passes,
    the same restart history no longer counts."""
    spec, times = Spec(STANDBY, BUDGET), (100.0, 101.0)
    assert next_action(Observed(102.0, STANDBY_KILLED, times), spec).kind is A.GIVE_UP
    assert next_action(Observed(160.5, STANDBY_KILLED, times), spec).kind is A.RESTART  # 100 left
    assert next_action(Observed(161.0, STANDBY_KILLED, times), spec).kind is A.RESTART  # both left


def test_restarts_in_window_matches_a_naive_count():
    rng = random.Random(5)
    for _ in range(500):
        times = tuple(sorted(rng.uniform(0, 100) for _ in range(rng.randint(0, 8))))
        now, window = rng.uniform(0, 120), rng.choice([0.5, 5.0, 30.0, 1000.0])
        naive = len([t for t in times if t > now - window and not t > now])
        assert restarts_in_window(times, now, window) == naive



FINISH_CASES = [
    # (name, proc, now, finish_by, expected action, words in reason)
    ("a trainer after COMPLETED, within the grace", proc(), 100.0, 700.0, A.WAIT, "finishing"),
    ("a trainer after COMPLETED, the grace just ending", proc(), 699.9, 700.0, A.WAIT, "finishing"),
    ("a trainer after COMPLETED, the grace over", proc(), 700.0, 700.0, A.STOP, "did not exit within the finish grace"),
    ("a standby after COMPLETED is stopped at once", proc(Role.STANDBY), 100.0, 700.0, A.STOP, "no trainer"),
    ("a trainer nobody wants while the job runs", proc(), 100.0, None, A.STOP, "no trainer"),
    ("a finishing trainer that exited", proc(exited=True, code=0), 100.0, 700.0, A.WAIT, "no longer wanted"),
]


@pytest.mark.parametrize("name,p,now,finish_by,kind,words", FINISH_CASES, ids=[c[0] for c in FINISH_CASES])
def test_a_trainer_finishes_its_own_work_after_completed_until_the_grace_ends(name, p, now, finish_by, kind, words):
    """On a fake clock: after the job COMPLETED a trainer's process is the user's (its work after
    Manager.close()) until `finish_by_s`; only then is it stopped."""
    action = next_action(Observed(now, p), Spec(IDLE, BUDGET, finish_by_s=finish_by))
    assert action.kind is kind, action.reason
    assert words in action.reason
    still_runs = words in ("finishing", "did not exit within the finish grace")
    assert is_finishing(p, Spec(IDLE, BUDGET, finish_by_s=finish_by)) is still_runs


KEEP_CASES = [
    # (name, outage_s, answered, trainers, kept)
    ("trainers that trained are kept past the timeout", 301.0, True, 2, True),
    ("up to twice the timeout", 600.0, True, 1, True),
    ("then the agent gives up", 600.1, True, 1, False),
    ("no trainer runs: nothing to keep", 301.0, True, 0, False),
    ("a first connection never answered: give up", 301.0, False, 2, False),
]


@pytest.mark.parametrize("name,outage_s,answered,trainers,kept", KEEP_CASES, ids=[c[0] for c in KEEP_CASES])
def test_an_agent_that_lost_its_controller_keeps_trainers_that_trained(name, outage_s, answered, trainers, kept):
    """Issue 41, on a fake clock: past the reconnect timeout (300 s here), an agent that had a
    working session keeps retrying while its trainers run (they hold the replica's state), for
    at most twice the timeout."""
    why = keep_trainers_past_timeout(outage_s, 300.0, answered, trainers)
    assert bool(why) is kept, why
    if kept:
        assert f"{trainers} trainer(s) still run" in why and "up to 600 s" in why
