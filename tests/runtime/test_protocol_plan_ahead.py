"""A blocking sync's quorum asked for ahead (sync_plan_ahead_steps = P) in the rank protocol
(no I/O, a fake clock).

DiLoCo with H = K = 4 inner steps per sync and P = 1: the begin of the sync of step s goes to
the coordinator at the Begin of inner step K - P = 3; a plan that arrives before the due step
is held (Flight.PLANNED), and the pseudo-gradient's all-reduce starts at the due Begin
(inner = K), from the state after all K inner steps, exactly as in the blocking sync. The
Manager feeds the sync's events between inner steps (phase IDLE), as these tests do."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.data_ledger import DataLedger
from fthsdp.settings import RuntimeSettings
from fthsdp.step import events as ev
from fthsdp.step.protocol import INF, Flight, Phase, next_deadline
from tests.runtime.protocol_helpers import SETTINGS, Run, plan, state

K, P = 4, 1
AHEAD = dataclasses.replace(SETTINGS, sync_mode="diloco", sync_every_steps=K, sync_plan_ahead_steps=P).validate()


def asked_ahead(step: int = 3, settings: RuntimeSettings = AHEAD, **fields) -> Run:
    """Inner steps up to K - P, the Begin that sends the sync's begin ahead, and that step's End."""
    run = Run(state(step, settings, **fields))
    run.inner_steps(K - P)
    run(ev.Begin())
    run(ev.End(0.5, 8))
    return run


def of_type(effects, kind) -> list:
    return [e for e in effects if isinstance(e, kind)]


def test_the_begin_goes_ahead_p_steps_early_without_serving_and_the_pseudo_gradient_waits_for_the_kth_step():
    run = Run(state(3, AHEAD))
    assert not of_type(run.inner_steps(K - P), ev.SendBegin)
    # the live state moves on for P more steps: nobody may fetch it (no ServeState)
    assert run(ev.Begin()) == (ev.SendBegin(3), ev.BeginInner(3, K - P))
    assert (run.state.phase, run.state.flight) == (Phase.INNER, Flight.PLANNING)
    assert next_deadline(run.state) == 100.0 + AHEAD.plan_timeout_s  # the plan's bound runs from the begin
    # the pseudo-gradient is the K-th step's, taken and dropped from the live model as without P
    assert run(ev.End(0.5, 8)) == (ev.InnerStep(3, K - P), ev.TakePseudoGradient(3, 0))


def test_a_plan_in_before_the_due_step_is_held_and_the_due_step_reduces_votes_and_commits_as_the_blocking_sync():
    run = asked_ahead()
    p = plan(3)
    assert run(ev.PlanArrived(1, 3, p)) == (ev.ConfigureRing(p, serving=False),)  # no reduce: no pseudo-gradient yet
    assert (run.state.phase, run.state.flight, next_deadline(run.state)) == (Phase.IDLE, Flight.PLANNED, INF)
    # the due step: nothing left to wait for but the sum
    assert run(ev.Begin()) == (ev.ReducePseudoGradient(p, 0, planned_ahead=True),)
    assert (run.state.phase, run.state.flight) == (Phase.SYNCING, Flight.NONE)
    assert run(ev.Reduced(True)) == (ev.SendVote(1, True, "", 0.5, 8 * K),)  # every inner step's tokens
    assert run.state.phase is Phase.VOTING
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert [type(e).__name__ for e in effects] == ["StopServing", "ApplyOuterStep", "Concluded"]
    assert of_type(effects, ev.ApplyOuterStep) == [ev.ApplyOuterStep(p, 0)]
    assert (run.state.phase, run.state.step, run.state.inner, run.state.flight) == (Phase.IDLE, 4, 0, Flight.NONE)
    assert run.state.ledger == DataLedger({"a": 3 + K, "b": 3 + K})  # K inner steps, once
    assert run(ev.Begin()) == (ev.BeginInner(4, 0),)  # the next sync's inner steps
    assert len(of_type(run.effects, ev.SendBegin)) == 1  # one begin for the sync, sent ahead


def test_a_plan_not_in_by_the_due_step_is_waited_for_there_with_the_deadline_of_its_begin():
    run = asked_ahead()
    assert run(ev.Begin(), at=101.0) == ()  # the begin went ahead: nothing sent again
    assert (run.state.phase, run.state.flight) == (Phase.PLANNING, Flight.NONE)
    assert next_deadline(run.state) == 100.0 + AHEAD.plan_timeout_s
    p = plan(3)
    assert run(ev.PlanArrived(1, 3, p)) == (ev.ServeState(3, ()), ev.ConfigureRing(p), ev.ReducePseudoGradient(p))
    run(ev.Tick(), at=100.0 + AHEAD.plan_timeout_s + 1)
    assert run.state.phase is Phase.SYNCING  # the plan came: its bound no longer applies
    late = asked_ahead()
    late(ev.Begin())
    late(ev.Tick(), at=100.0 + AHEAD.plan_timeout_s)
    assert late.state.phase is Phase.FAILED and "got no answer from its coordinator" in late.state.reason


@pytest.mark.parametrize("catch_up", ["behind", "fetchers", "a member not healthy"])
def test_a_catch_up_planned_ahead_is_deferred_to_a_blocking_sync_that_serves_at_the_due_step(catch_up):
    """Nobody may fetch a state that still trains: the quorum votes no ahead (not counted as a
    failure), and the due step syncs blocking, serving its state from the due step's Begin."""
    p = {"behind": plan(3, behind=True), "fetchers": plan(3, fetchers=("c",)),
         "a member not healthy": plan(3, included=("a",))}[catch_up]
    run = asked_ahead()
    (vote,) = run(ev.PlanArrived(1, 3, p))
    assert not vote.ok and "catching up" in vote.reason and run.state.flight is Flight.VOTING
    run(ev.DecisionArrived(1, False, "a replica voted no"))
    assert (run.state.phase, run.state.flight, run.state.failures_in_a_row) == (Phase.IDLE, Flight.NONE, 0)
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))  # the blocking sync at the due step
    assert run.state.phase is Phase.PLANNING


def test_a_retry_or_a_newer_attempt_while_the_plan_is_held_leaves_the_due_step_to_sync_blocking():
    for ending in (ev.DecisionArrived(1, False, "replica a lost"), ev.PlanArrived(2, 3, plan(3)),
                   ev.PlanRefused(2, ev.Refusal.RETRY, "quorum not ready", 3)):
        run = asked_ahead()
        run(ev.PlanArrived(1, 3, plan(3)))
        effects = run(ending)
        assert not of_type(effects, ev.DropGradients) and not of_type(effects, ev.DropReduce)  # nothing to drop
        assert of_type(effects, ev.Concluded)[0].outcome.committed is False
        assert (run.state.phase, run.state.flight, run.state.inner) == (Phase.IDLE, Flight.NONE, K)
        assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))  # the same pseudo-gradient, synced blocking


def test_a_commit_for_a_held_plan_is_fatal_and_late_messages_change_nothing():
    run = asked_ahead()
    run(ev.PlanArrived(1, 3, plan(3)))
    before = run.state
    assert run(ev.PlanArrived(1, 3, plan(3))) == () and run(ev.Tick(), at=10_000.0) == ()  # late; no deadline
    assert run.state == before
    run(ev.DecisionArrived(1, True, "all yes"))  # this rank never voted
    assert run.state.phase is Phase.FAILED and "before rank 0 voted" in run.state.reason


def test_close_while_the_plan_is_held_finishes_the_replica():
    run = asked_ahead()
    run(ev.PlanArrived(1, 3, plan(3)))
    effects = run(ev.Close("done"))
    assert of_type(effects, ev.SendClose) and not of_type(effects, ev.DropReduce)
    assert (run.state.phase, run.state.flight) == (Phase.FINISHING, Flight.NONE)


def test_a_torn_rank_never_asks_ahead():
    run = Run(state(3, AHEAD, torn=True))
    run.inner_steps(K - P)
    assert run(ev.Begin()) == (ev.BeginInner(3, K - P),) and run.state.flight is Flight.NONE
    run(ev.End(0.5, 8))
    assert run(ev.Begin()) == (ev.SendBegin(3),)  # the blocking sync, serving nobody


def test_p_equal_to_k_asks_right_after_the_previous_commit():
    s = dataclasses.replace(AHEAD, sync_plan_ahead_steps=K).validate()
    run = Run(state(3, s))
    assert run(ev.Begin()) == (ev.SendBegin(3), ev.BeginInner(3, 0))


# ---------------------------------------------------------------- the setting


@pytest.mark.parametrize("fields, message", [
    ({"sync_plan_ahead_steps": K + 1}, f"sync_plan_ahead_steps={K + 1} must be at most sync_every_steps / "
                                       f"sync_fragments = {K}"),
    ({"sync_plan_ahead_steps": -1}, "sync_plan_ahead_steps must be a number of inner steps >= 0, got -1"),
    ({"sync_mode": "sync", "sync_every_steps": 1, "sync_plan_ahead_steps": 1},
     "sync_plan_ahead_steps=1 needs a semi-synchronous sync_mode"),
    ({"sync_mode": "streaming_diloco", "sync_every_steps": 8, "sync_fragments": 2, "sync_plan_ahead_steps": 1},
     "sync_plan_ahead_steps=1 with sync_overlap_steps=3"),
])
def test_a_bad_plan_ahead_is_refused_naming_the_value_and_the_bound(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        dataclasses.replace(AHEAD, **fields).validate()


def test_the_plan_ahead_comes_from_the_environment_and_is_off_by_default():
    env = {"FTHSDP_SYNC_MODE": "diloco", "FTHSDP_SYNC_EVERY_STEPS": "8"}
    s = RuntimeSettings.from_env({**env, "FTHSDP_SYNC_PLAN_AHEAD_STEPS": "3"}, controller_address="c:1",
                                 insecure_trainer_ports=True)
    assert s.sync_plan_ahead_steps == 3
    default = RuntimeSettings.from_env(env, controller_address="c:1", insecure_trainer_ports=True)
    assert default.sync_plan_ahead_steps == 0  # off: bench.semisync measured no gain (fthsdp/settings.py says)
    run = Run(state(3, default))
    assert not of_type(run.inner_steps(8), ev.SendBegin) and run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))
    with pytest.raises(ValueError, match="sync_plan_ahead_steps must be a number of inner steps >= 0, got None"):
        dataclasses.replace(default, sync_plan_ahead_steps=None).validate()
    blocking_streaming = dataclasses.replace(default, sync_mode="streaming_diloco", sync_fragments=2,
                                             sync_overlap_steps=0, sync_plan_ahead_steps=4).validate()
    assert blocking_streaming.sync_plan_ahead_steps == 4  # K = 4: asked right after the previous commit
