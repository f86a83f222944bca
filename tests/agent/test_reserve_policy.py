"""Table tests for warm restarts: `reserve_action` (the slot's reserve standby) and the swap-in
of a reserve by `next_action`, on a fake clock (times are plain numbers)."""

from __future__ import annotations

import pytest

from agent.policy import (ActionKind, Observed, Placement, Proc, RestartBudget, Role, Spec, Want, next_action,
                          reserve_action)

A = ActionKind
R0 = Placement("r0", 0, 2, rendezvous="10.0.0.1:29500", coordinator="10.0.0.1:29501")
TRAIN = Want(Role.TRAIN, 1, R0)
STANDBY = Want(Role.STANDBY, 1)
IDLE = Want(Role.IDLE, 1)
BUDGET = RestartBudget(restarts=2, window_s=60.0)

RUNNING = Proc(Role.TRAIN, 1, R0)
KILLED = Proc(Role.TRAIN, 1, R0, exited=True, signal=9)
OLD = Proc(Role.TRAIN, 0, R0)  # of an older generation: a RESTART order came
RESERVE = Proc(Role.STANDBY, 1)
RESERVE_DIED = Proc(Role.STANDBY, 1, exited=True, exit_code=1)


def warm(want: Want = TRAIN, on: bool = True) -> Spec:
    return Spec(want, BUDGET, warm_restarts=on)


RESERVE_CASES = [
    # (name, trainer, reserve, want, warm restarts on, reserve restart times, action, words in reason)
    ("trainer runs, no reserve yet", RUNNING, None, TRAIN, True, (), A.START, "next to replica r0 rank 0"),
    ("trainer runs, reserve ready", RUNNING, RESERVE, TRAIN, True, (), A.WAIT, "ready"),
    ("no trainer yet: no reserve yet", None, None, TRAIN, True, (), A.WAIT, "once the slot's trainer runs"),
    ("trainer died: no new reserve", KILLED, None, TRAIN, True, (), A.WAIT, "once the slot's trainer runs"),
    ("a spare's standby runs: no reserve", Proc(Role.STANDBY, 1), None, STANDBY, True, (), A.WAIT,
     "no reserve is wanted"),
    ("setting off: none started", RUNNING, None, TRAIN, False, (), A.WAIT, "no reserve is wanted"),
    ("setting off: a running one goes", RUNNING, RESERVE, TRAIN, False, (), A.STOP, "warm restarts are off"),
    ("slot goes idle (job completed)", RUNNING, RESERVE, IDLE, True, (), A.STOP, "trains no more"),
    ("host released to the pool", RUNNING, RESERVE, STANDBY, True, (), A.STOP, "trains no more"),
    ("reserve died", RUNNING, RESERVE_DIED, TRAIN, True, (), A.RESTART, "0 of 2"),
    ("reserve killed, one restart used", RUNNING, Proc(Role.STANDBY, 1, exited=True, signal=9), TRAIN, True,
     (90.0,), A.RESTART, "signal 9"),
    ("reserve died, budget spent", RUNNING, RESERVE_DIED, TRAIN, True, (90.0, 95.0), A.GIVE_UP, "restarts are cold"),
    ("reserve died, old restarts left the window", RUNNING, RESERVE_DIED, TRAIN, True, (10.0, 39.9), A.RESTART,
     "0 of 2"),
    ("reserve died, slot idle", None, RESERVE_DIED, IDLE, True, (), A.WAIT, "no longer wanted"),
    ("gave up: no new reserve in the window", RUNNING, None, TRAIN, True, (90.0, 95.0), A.WAIT,
     "budget exhausted"),
]


@pytest.mark.parametrize("name,trainer,reserve,want,on,times,kind,words", RESERVE_CASES,
                         ids=[c[0] for c in RESERVE_CASES])
def test_reserve_action(name, trainer, reserve, want, on, times, kind, words):
    observed = Observed(100.0, trainer, reserve=reserve, reserve_restart_times_s=times)
    action = reserve_action(observed, warm(want, on))
    assert action.kind is kind, action.reason
    assert words in action.reason


def test_the_reserve_table_covers_every_reserve_decision():
    seen = {reserve_action(Observed(100.0, c[1], reserve=c[2], reserve_restart_times_s=c[5]), warm(c[3], c[4])).kind
            for c in RESERVE_CASES}
    assert seen == {A.START, A.RESTART, A.STOP, A.WAIT, A.GIVE_UP}


def test_a_reserve_starts_the_delay_after_its_trainer_on_a_fake_clock():
    """Its imports would compete with the trainer's own start: it waits `reserve_delay_s`."""
    spec = Spec(TRAIN, BUDGET, warm_restarts=True, reserve_delay_s=5.0)
    started = Proc(Role.TRAIN, 1, R0, started_s=100.0)
    assert reserve_action(Observed(100.0, started), spec).kind is A.WAIT
    waiting = reserve_action(Observed(104.9, started), spec)
    assert waiting.kind is A.WAIT and "5 s after its trainer" in waiting.reason
    assert reserve_action(Observed(105.0, started), spec).kind is A.START
    # A reserve that died is restarted at once: its trainer is past its start.
    assert reserve_action(Observed(101.0, started, reserve=RESERVE_DIED), spec).kind is A.RESTART


SWAP_CASES = [
    # (name, trainer, reserve, want, halted generation, action, words)
    ("restart after the old trainer stopped", None, RESERVE, TRAIN, None, A.SWAP_IN, "reserve standby takes"),
    ("old trainer still runs: stopped first", OLD, RESERVE, TRAIN, None, A.STOP, "restart ordered"),
    ("new placement: old trainer stopped first", Proc(Role.TRAIN, 1, Placement("r9", 0, 2)), RESERVE, TRAIN, None,
     A.STOP, "placement changed"),
    ("replica halted: the reserve waits for the order", None, RESERVE, TRAIN, 1, A.WAIT, "halted"),
    ("reserve died: cold start", None, RESERVE_DIED, TRAIN, None, A.START, "starting replica r0"),
    ("no reserve: cold start", None, None, TRAIN, None, A.START, "starting replica r0"),
    ("a reserve never becomes a spare's standby", None, RESERVE, STANDBY, None, A.START, "pre-starting a standby"),
]


@pytest.mark.parametrize("name,trainer,reserve,want,halted,kind,words", SWAP_CASES, ids=[c[0] for c in SWAP_CASES])
def test_next_action_with_a_reserve(name, trainer, reserve, want, halted, kind, words):
    action = next_action(Observed(100.0, trainer, halted_generation=halted, reserve=reserve), warm(want))
    assert action.kind is kind, action.reason
    assert words in action.reason


def test_a_restart_on_a_fake_clock_runs_warm_from_start_to_the_next_reserve():
    """The whole cycle as the supervisor drives it: trainer starts cold (no reserve yet), a
    reserve is started beside it, the trainer dies and the replica halts, the RESTART order
    comes (a new generation), the reserve is swapped in, and a new reserve is started."""
    spec = warm(Want(Role.TRAIN, 1, R0))
    assert next_action(Observed(0.0, None), spec).kind is A.START
    assert reserve_action(Observed(1.0, RUNNING), spec).kind is A.START
    assert next_action(Observed(5.0, KILLED, reserve=RESERVE), spec).kind is A.HALT_REPLICA
    halted = Observed(5.0, None, halted_generation=1, reserve=RESERVE)
    assert next_action(halted, spec).kind is A.WAIT
    assert reserve_action(halted, spec).kind is A.WAIT  # kept for the restart
    restarted = warm(Want(Role.TRAIN, 2, R0))
    assert next_action(Observed(6.0, None, halted_generation=1, reserve=RESERVE), restarted).kind is A.SWAP_IN
    swapped = Observed(6.0, Proc(Role.TRAIN, 2, R0), halted_generation=1)
    assert next_action(swapped, restarted).kind is A.WAIT
    assert reserve_action(swapped, restarted).kind is A.START
