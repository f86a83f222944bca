"""Streaming DiLoCo's overlapped fragment sync in the rank protocol (no I/O, a fake clock).

H = 8 inner steps between two syncs of the same parameters, F = 2 fragments: a sync every
K = 4 inner steps; tau = sync_overlap_steps = 2: the sync of step s is prepared at inner
K - tau = 2 (pseudo-gradient taken, begin sent) and is due at inner K = 4. The Manager feeds
the sync's events between inner steps (phase IDLE), as these tests do."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.data_ledger import DataLedger
from fthsdp.settings import RuntimeSettings
from fthsdp.step import events as ev
from fthsdp.step.protocol import _FLIGHT_TABLE, INF, Flight, Phase, ProtocolError, next_deadline
from tests.runtime.protocol_helpers import SETTINGS, Run, plan, state

H, F, TAU = 8, 2, 2
K = H // F
OVERLAP = dataclasses.replace(SETTINGS, sync_mode="streaming_diloco", sync_every_steps=H, sync_fragments=F,
                              sync_overlap_steps=TAU).validate()


def in_flight(step: int = 3, **fields) -> Run:
    """Inner steps up to the prepare point, and the Begin that sends the sync ahead."""
    run = Run(state(step, OVERLAP, **fields))
    run.inner_steps(K - TAU)
    run(ev.Begin())
    return run


def of_type(effects, kind) -> list:
    return [e for e in effects if isinstance(e, kind)]


def test_the_pseudo_gradient_is_taken_tau_steps_early_and_keeps_the_local_fragment_training():
    run = Run(state(3, OVERLAP))
    effects = run.inner_steps(K - TAU)
    assert of_type(effects, ev.TakePseudoGradient) == [ev.TakePseudoGradient(3, 0, keep_local=True)]
    assert effects[-1] == ev.TakePseudoGradient(3, 0, keep_local=True)  # after the step that brings inner to K - tau
    # the next Begin sends the sync ahead: no ServeState (the live state moves on), and trains
    assert run(ev.Begin()) == (ev.SendBegin(3), ev.BeginInner(3, K - TAU))
    assert (run.state.phase, run.state.flight, run.state.inner) == (Phase.INNER, Flight.PLANNING, K - TAU)
    run(ev.End(0.5, 8))
    assert next_deadline(run.state) == 100.0 + OVERLAP.plan_timeout_s  # the plan's bound runs on


def test_the_plan_and_the_all_reduce_start_before_the_next_inner_step_and_the_trainer_never_waits():
    """The overlap overlaps: from the prepare point to the due step the effects are inner steps
    and the started reduce; nothing that waits (AwaitReduce) comes before the due Begin."""
    run = in_flight()
    run(ev.End(0.5, 8))
    p = plan(3)
    started = run(ev.PlanArrived(1, 3, p))
    assert started == (ev.ConfigureRing(p, serving=False), ev.StartReduce(p, 0))
    assert run.state.flight is Flight.REDUCING and run.state.background
    order = [type(e).__name__ for e in run.effects]
    assert order[order.index("SendBegin"):] == ["SendBegin", "BeginInner", "InnerStep", "ConfigureRing",
                                                "StartReduce"]
    assert run(ev.Begin()) == (ev.BeginInner(3, K - TAU + 1),)  # the next inner step runs while it reduces
    assert run(ev.End(0.5, 8)) == (ev.InnerStep(3, K - TAU + 1),)
    assert not of_type(run.effects, ev.AwaitReduce)
    assert run(ev.Reduced(True)) == (ev.SendVote(1, True, "", 0.5, 8 * (K - TAU + 2)),)
    assert (run.state.phase, run.state.flight) == (Phase.IDLE, Flight.VOTING)
    assert next_deadline(run.state) == 100.0 + OVERLAP.decision_timeout_s


def test_during_an_inner_step_the_flight_moves_on_and_the_phase_stays_inner():
    """The flight waker feeds the sync's events while the trainer computes (phase INNER): the
    plan starts the reduce, its end votes, the commit is held; the inner step then ends as usual.
    A transition that would leave INNER (here a refusal's retry) is the Manager's to hold."""
    run = in_flight()
    assert next_deadline(run.state) == 100.0 + OVERLAP.plan_timeout_s  # during the inner step too
    p = plan(3)
    assert run(ev.PlanArrived(1, 3, p)) == (ev.ConfigureRing(p, serving=False), ev.StartReduce(p, 0))
    assert (run.state.phase, run.state.flight) == (Phase.INNER, Flight.REDUCING)
    assert run(ev.Reduced(True)) == (ev.SendVote(1, True, "", 0.5, 8 * (K - TAU)),)  # what the steps so far trained
    assert (run.state.phase, run.state.flight) == (Phase.INNER, Flight.VOTING)
    assert next_deadline(run.state) == 100.0 + OVERLAP.decision_timeout_s
    assert run(ev.DecisionArrived(1, True, "")) == ()
    assert (run.state.phase, run.state.flight) == (Phase.INNER, Flight.COMMITTED)
    assert run(ev.End(0.5, 8)) == (ev.InnerStep(3, K - TAU),)
    assert (run.state.phase, run.state.inner) == (Phase.IDLE, K - TAU + 1)
    refused = in_flight()
    refused(ev.PlanRefused(1, ev.Refusal.RETRY, "quorum not ready", 3))
    assert refused.state.phase is Phase.IDLE and refused.state.flight is Flight.NONE


def test_a_commit_in_flight_is_held_until_the_due_step_then_applied_with_the_overlap_counted_once():
    run = in_flight()
    run(ev.End(0.5, 8))
    p = plan(3)
    run(ev.PlanArrived(1, 3, p))
    run(ev.Reduced(True))
    assert run(ev.DecisionArrived(1, True, "all yes")) == ()  # held: nothing applied yet
    assert run.state.flight is Flight.COMMITTED and run.state.step == 3 and next_deadline(run.state) == INF
    run.inner_steps(K - TAU - 1)  # the rest of the overlap trains as usual
    assert run.state.inner == K
    effects = run(ev.Begin())  # the due step
    assert [type(e).__name__ for e in effects] == ["StopServing", "GatherReduced", "ApplyOuterStep", "Concluded"]
    assert of_type(effects, ev.ApplyOuterStep) == [ev.ApplyOuterStep(p, 0)]
    assert (run.state.phase, run.state.step, run.state.inner, run.state.flight) == (Phase.IDLE, 4, 0, Flight.NONE)
    assert run.state.ledger == DataLedger({"a": 3 + K, "b": 3 + K})  # K inner steps, overlap included
    # the overlap's tokens were not in the vote: they go with the next sync's
    assert run(ev.Begin()) == (ev.BeginInner(4, 0),) and run.state.tokens == 8 * (TAU - 1)


def test_a_retry_in_flight_drops_the_reduce_and_the_due_step_syncs_blocking_with_the_same_pseudo_gradient():
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3)))
    effects = run(ev.DecisionArrived(1, False, "rank 0 of replica a voted no: FTAR peer reset"))
    assert [type(e).__name__ for e in effects] == ["DropReduce", "Concluded"]  # no DropGradients: the inner step's are kept
    assert (run.state.phase, run.state.flight, run.state.failures_in_a_row) == (Phase.IDLE, Flight.NONE, 1)
    effects = run.inner_steps(K - TAU - 1)
    assert not of_type(effects, ev.TakePseudoGradient)  # the pseudo-gradient taken at K - tau stays
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))  # today's blocking sync at the due step
    p = plan(3, quorum_id=10, included=("b",))
    assert run(ev.PlanArrived(2, 3, p))[-1] == ev.ReducePseudoGradient(p, 0)
    run(ev.Reduced(True))
    effects = run(ev.DecisionArrived(2, True, "all yes"))
    assert not of_type(effects, ev.GatherReduced)  # the blocking reduce gathered already
    assert run.state.ledger == DataLedger({"a": 3, "b": 3 + K}) and run.state.step == 4


@pytest.mark.parametrize("catch_up", [
    {"included": ("a",)},               # another member is behind: it contributes zeros
    {"fetchers": ("c",)},               # a behind replica would fetch from this rank
    {"behind": True},                   # this replica itself is behind
])
def test_a_catch_up_in_flight_is_deferred_to_a_blocking_sync_at_the_due_step_and_not_counted(catch_up):
    run = in_flight()
    run(ev.End(0.5, 8))
    p = plan(5 if catch_up.get("behind") else 3, **catch_up)
    # no ring (no sum another replica could commit without it), no fetch, no serving: nobody may
    # fetch a moving state
    [vote] = run(ev.PlanArrived(1, 3, p))
    assert not vote.ok and "a catch-up needs a quiescent sync: retried at the due step" in vote.reason
    assert run.state.flight is Flight.VOTING and run.state.deferred
    assert not of_type(run(ev.DecisionArrived(1, False, "replica a voted no")), ev.DropReduce)
    assert run.state.failures_in_a_row == 0 and run.state.flight is Flight.NONE  # a deferral is not a failure
    run.inner_steps(K - TAU - 1)
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))  # the catch-up's quiescent sync


def test_deferrals_never_exhaust_max_retries_but_failures_in_flight_count():
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3, included=("a",))))
    assert run.state.deferred
    run(ev.DecisionArrived(1, False, "a voted no"))
    assert run.state.failures_in_a_row == 0
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, None, "quorum 9 came without the addresses of ['c']"))
    assert of_type(run.effects, ev.SendVote)[-1].reason == "quorum 9 came without the addresses of ['c']"
    run(ev.DecisionArrived(1, False, "b voted no"))
    assert run.state.failures_in_a_row == 1


@pytest.mark.parametrize("flight, phase, effects", [
    ("planning", Phase.PLANNING, ()),
    ("reducing", Phase.SYNCING, (ev.AwaitReduce(),)),
    ("voting", Phase.VOTING, ()),
])
def test_at_the_due_step_an_undecided_sync_is_waited_for_as_a_blocking_one_with_its_deadlines(flight, phase, effects):
    run = in_flight()
    run(ev.End(0.5, 8))
    if flight != "planning":
        run(ev.PlanArrived(1, 3, plan(3)))
    if flight == "voting":
        run(ev.Reduced(True))
    deadline = run.state.deadline
    run.inner_steps(K - TAU - 1)
    assert run(ev.Begin(), at=150.0) == effects
    assert (run.state.phase, run.state.flight, run.state.deadline) == (phase, Flight.NONE, deadline)
    if flight == "reducing":  # the awaited reduce comes in: vote, then the commit applies at once
        assert of_type(run(ev.Reduced(True)), ev.SendVote)
    if flight != "planning":
        effects = run(ev.DecisionArrived(1, True, "all yes"))
        assert [type(e).__name__ for e in effects][:3] == ["StopServing", "GatherReduced", "ApplyOuterStep"]
        assert (run.state.step, run.state.inner) == (4, 0)
    else:  # the plan at the due step: today's blocking sync, which may serve a catch-up now
        p = plan(3, fetchers=("c",))
        assert run(ev.PlanArrived(1, 3, p)) == (ev.ServeState(3, ("c",)), ev.ConfigureRing(p),
                                                ev.ReducePseudoGradient(p, 0))


def test_a_reduce_that_failed_votes_no_and_its_retry_drops_it():
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3)))
    assert run(ev.Reduced(False, "FTAR all-reduce of step 3 failed: peer reset")) == (
        ev.SendVote(1, False, "FTAR all-reduce of step 3 failed: peer reset", 0.5, 8 * (K - TAU + 1)),)
    effects = run(ev.DecisionArrived(1, False, "b voted no"))
    assert of_type(effects, ev.DropReduce) and run.state.failures_in_a_row == 1


def test_a_newer_attempt_in_flight_ends_this_one_and_a_refusal_retries():
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3)))
    effects = run(ev.PlanArrived(2, 3, plan(3, quorum_id=11)))
    assert of_type(effects, ev.DropReduce) and run.state.flight is Flight.NONE
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanRefused(1, ev.Refusal.RETRY, "quorum timed out"))
    assert (run.state.flight, run.state.failures_in_a_row) == (Flight.NONE, 1)
    run = in_flight()
    run(ev.End(0.5, 8))
    effects = run(ev.PlanRefused(1, ev.Refusal.FINISHED, "job COMPLETED"))
    assert effects == (ev.Ended("job COMPLETED"),) and run.state.phase is Phase.ENDED


def test_close_in_flight_drops_the_reduce_and_finishes():
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3)))
    effects = run(ev.Close())
    assert [type(e).__name__ for e in effects] == ["DropReduce", "SendClose"]
    assert (run.state.phase, run.state.flight) == (Phase.FINISHING, Flight.NONE)


@pytest.mark.parametrize("when", ["planning", "voting"])
def test_a_sync_in_flight_fails_past_its_deadline_on_the_fake_clock_and_on_a_lost_coordinator(when):
    run = in_flight()
    run(ev.End(0.5, 8))
    if when == "voting":
        run(ev.PlanArrived(1, 3, plan(3)))
        run(ev.Reduced(True))
    deadline = run.state.deadline
    assert run(ev.Tick(), at=deadline - 0.1) == ()
    [fail] = run(ev.Tick(), at=deadline)
    assert isinstance(fail, ev.Fail) and run.state.phase is Phase.FAILED and run.state.flight is Flight.NONE
    assert ("no answer from its coordinator" if when == "planning" else "no decision came") in fail.message
    run = in_flight()
    run(ev.End(0.5, 8))
    [fail] = run(ev.CoordinatorLost("connection reset"))
    assert "lost its coordinator" in fail.message


def test_a_commit_this_rank_did_not_vote_for_is_fatal_in_flight():
    run = in_flight()
    run(ev.End(0.5, 8))
    [fail] = run(ev.DecisionArrived(1, True, "all yes"))  # it never got the plan
    assert isinstance(fail, ev.Fail) and "before rank 0 voted" in fail.message
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3, included=("a",))))  # deferred: it voted no
    [fail] = run(ev.DecisionArrived(1, True, "all yes"))
    assert "although rank 0 voted no" in fail.message


def test_late_and_stale_messages_in_flight_change_nothing_and_a_local_reduce_out_of_place_raises():
    run = in_flight()
    run(ev.End(0.5, 8))
    run(ev.PlanArrived(1, 3, plan(3)))
    before = run.state
    assert run(ev.PlanArrived(1, 3, plan(3))) == () and run(ev.DecisionArrived(0, False, "old")) == ()
    assert run.state == before
    run(ev.Reduced(True))
    with pytest.raises(ProtocolError):
        run(ev.Reduced(True))  # the reduce reported twice: a bug in the Manager


def test_a_torn_rank_never_syncs_ahead():
    run = Run(state(3, OVERLAP, torn=True))
    run.inner_steps(K - TAU)
    assert run(ev.Begin()) == (ev.BeginInner(3, K - TAU),) and run.state.flight is Flight.NONE
    run(ev.End(0.5, 8))
    run.inner_steps(TAU - 1)
    assert run(ev.Begin()) == (ev.SendBegin(3),)  # the blocking sync, serving nobody


def test_without_an_overlap_the_sync_blocks_at_the_kth_step_as_before():
    s = dataclasses.replace(OVERLAP, sync_overlap_steps=0, sync_plan_ahead_steps=0).validate()
    run = Run(state(3, s))
    effects = run.inner_steps(K)
    assert of_type(effects, ev.TakePseudoGradient) == [ev.TakePseudoGradient(3, 0)]
    assert not of_type(effects, ev.SendBegin)
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))


def test_the_flight_table_is_what_the_docstring_draws():
    assert set(_FLIGHT_TABLE) == {
        (Flight.PLANNING, ev.PlanArrived), (Flight.PLANNING, ev.ResumeOrdered), (Flight.PLANNING, ev.PlanRefused),
        (Flight.PLANNING, ev.DecisionArrived), (Flight.PLANNING, ev.Tick),
        (Flight.REDUCING, ev.Reduced), (Flight.REDUCING, ev.PlanArrived), (Flight.REDUCING, ev.PlanRefused),
        (Flight.REDUCING, ev.DecisionArrived),
        (Flight.VOTING, ev.DecisionArrived), (Flight.VOTING, ev.Tick),
        (Flight.PLANNED, ev.PlanArrived), (Flight.PLANNED, ev.PlanRefused), (Flight.PLANNED, ev.DecisionArrived)}


# ---------------------------------------------------------------- the setting


@pytest.mark.parametrize("fields, message", [
    ({"sync_overlap_steps": 4}, "sync_overlap_steps=4 must be below sync_every_steps / sync_fragments = 4"),
    ({"sync_overlap_steps": -1}, "sync_overlap_steps must be a number of inner steps >= 0, got -1"),
    ({"sync_mode": "diloco", "sync_fragments": 1, "sync_overlap_steps": 1},
     "sync_overlap_steps=1 needs sync_mode streaming_diloco (got 'diloco')"),
])
def test_a_bad_overlap_is_refused_naming_the_value_and_the_bound(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        dataclasses.replace(OVERLAP, **fields).validate()


def test_the_overlap_comes_from_the_environment_and_defaults_by_mode():
    env = {"FTHSDP_SYNC_MODE": "streaming_diloco", "FTHSDP_SYNC_EVERY_STEPS": "8", "FTHSDP_SYNC_FRAGMENTS": "2"}
    s = RuntimeSettings.from_env({**env, "FTHSDP_SYNC_OVERLAP_STEPS": "3"}, controller_address="c:1",
                                 insecure_trainer_ports=True)
    assert (s.sync_overlap_steps, s.overlap_steps) == (3, 3)
    default = RuntimeSettings.from_env(env, controller_address="c:1", insecure_trainer_ports=True)
    assert (default.sync_overlap_steps, default.overlap_steps) == (None, 3)  # K - 1
    one_step = dataclasses.replace(default, sync_every_steps=2).validate()  # K = 1: nothing to overlap
    assert one_step.overlap_steps == 0
    assert dataclasses.replace(default, sync_mode="diloco", sync_fragments=1).validate().overlap_steps == 0
