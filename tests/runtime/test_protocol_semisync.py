"""The rank protocol's semi-synchronous phases (INNER, SYNCING), transition by transition (no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.data_ledger import DataLedger
from fthsdp.step import events as ev
from fthsdp.step.protocol import _TABLE, INF, Fetch, Phase, ProtocolError, next_deadline
from tests.runtime.protocol_helpers import SETTINGS, Run, plan, state

H = 3
#: the blocking sync: its begin sent at the due step (the plan asked for ahead: test_protocol_plan_ahead.py)
SEMI = dataclasses.replace(SETTINGS, sync_mode="diloco", sync_every_steps=H, sync_plan_ahead_steps=0).validate()


def at_sync(step: int = 3, **fields) -> Run:
    run = Run(state(step, SEMI, **fields))
    run.inner_steps(H)
    return run


def test_inner_steps_never_reach_the_coordinator_and_the_last_takes_the_pseudo_gradient():
    run = Run(state(3, SEMI))
    assert run(ev.Begin()) == (ev.BeginInner(3, 0),)
    assert (run.state.phase, next_deadline(run.state)) == (Phase.INNER, INF)
    assert run(ev.End(0.9, 8)) == (ev.InnerStep(3, 0),)
    assert (run.state.phase, run.state.inner, run.state.step) == (Phase.IDLE, 1, 3)
    assert run.inner_steps(1) == [ev.BeginInner(3, 1), ev.InnerStep(3, 1)]
    assert run.inner_steps(1) == [ev.BeginInner(3, 2), ev.InnerStep(3, 2), ev.TakePseudoGradient(3)]
    assert run.state.inner == H and run.state.ledger == DataLedger({"a": 3, "b": 3})  # nothing committed yet


def test_the_sync_is_a_step_of_the_protocol_whose_commit_applies_the_outer_step_and_moves_the_ledger_by_h():
    run = at_sync(3)
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))
    p = plan(3, fetchers=("c",))
    # no training script between plan and vote: the plan itself asks for the pseudo-gradient's average
    assert run(ev.PlanArrived(1, 3, p)) == (ev.ServeState(3, ("c",)), ev.ConfigureRing(p), ev.ReducePseudoGradient(p))
    assert run.state.phase is Phase.SYNCING
    (vote,) = run(ev.Reduced(True))
    assert vote == ev.SendVote(1, True, "", 0.5, 3 * 8)  # the last inner loss, the inner steps' tokens
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    kinds = [type(e).__name__ for e in effects]
    assert kinds == ["StopServing", "ApplyOuterStep", "Concluded", "SendDigest"] and "ApplyStep" not in kinds
    assert (run.state.phase, run.state.step, run.state.inner) == (Phase.IDLE, 4, 0)
    assert run.state.ledger == DataLedger({"a": 3 + H, "b": 3 + H})
    assert run(ev.Begin()) == (ev.BeginInner(4, 0),)


def test_a_retried_sync_keeps_its_pseudo_gradient_and_syncs_again_without_new_inner_steps():
    run = at_sync(3)
    run(ev.Begin())
    run(ev.PlanArrived(1, 3, plan(3)))
    run(ev.Reduced(False, "FTAR all-reduce of step 3 failed: peer reset"))
    effects = run(ev.DecisionArrived(1, False, "replica a voted no"))
    assert [type(e).__name__ for e in effects] == ["DropGradients", "Concluded"]
    assert (run.state.phase, run.state.inner, run.state.step) == (Phase.IDLE, H, 3)
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))  # a sync again, not an inner step
    p = plan(3, quorum_id=10, included=("b",))
    assert run(ev.PlanArrived(2, 3, p))[-1] == ev.ReducePseudoGradient(p)
    run(ev.Reduced(True))
    run(ev.DecisionArrived(2, True, "all yes"))
    assert run.state.ledger == DataLedger({"a": 3, "b": 3 + H})  # only the contributor's batches are committed
    assert not any(isinstance(e, ev.TakePseudoGradient) for e in run.effects[-8:])


def test_a_behind_replica_contributes_zeros_fetches_and_takes_its_sources_ledger_at_the_commit():
    run = at_sync(0)
    run(ev.Begin())
    p = plan(5, behind=True)
    assert run(ev.PlanArrived(1, 0, p)) == (ev.StopServing(), ev.ConfigureRing(p), ev.StartFetch(p),
                                            ev.ReducePseudoGradient(p))
    assert run(ev.Reduced(True)) == () and run.state.ending  # the vote waits for the fetch
    (vote,) = run(ev.FetchFinished(True, "", DataLedger({"a": 15, "b": 12})))
    assert vote.ok
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert [type(e).__name__ for e in effects][:3] == ["StopServing", "AdoptFetched", "ApplyOuterStep"]
    assert (run.state.step, run.state.inner) == (6, 0)
    assert run.state.ledger == DataLedger({"a": 15 + H, "b": 12})  # its own inner steps are not in the history


def test_a_plan_that_does_not_fit_still_runs_the_replicas_reduction_and_votes_no():
    run = at_sync(3)
    run(ev.Begin())
    assert run(ev.PlanArrived(1, 3, None, "member c lists no address")) == (ev.ReducePseudoGradient(None),)
    (vote,) = run(ev.Reduced(False, "no plan for this step"))
    assert (vote.ok, vote.reason) == (False, "member c lists no address")


def test_max_steps_ends_the_replica_only_at_a_sync_boundary():
    s = dataclasses.replace(SEMI, max_steps=4)
    run = Run(state(3, s))
    run.inner_steps(H)
    run(ev.Begin())
    run(ev.PlanArrived(1, 3, plan(3)))
    run(ev.Reduced(True))
    run(ev.DecisionArrived(1, True, "all yes"))
    assert run(ev.Begin()) == (ev.Ended("max_steps=4 reached"),)
    assert run.state.phase is Phase.ENDED


def test_a_rollback_during_a_sync_drops_the_inner_steps_the_checkpoint_does_not_hold():
    run = at_sync(1)  # the durable checkpoint is newer than this replica's state
    run(ev.Begin())
    assert run(ev.ResumeOrdered(1, 1, 9, 4)) == (ev.StopServing(), ev.LoadCheckpoint(5))
    run(ev.CheckpointLoaded(5, DataLedger({"a": 15, "b": 15})))
    assert (run.state.phase, run.state.step, run.state.inner) == (Phase.IDLE, 5, 0)
    assert run(ev.Begin()) == (ev.BeginInner(5, 0),)


@pytest.mark.parametrize("where", ["inner", "syncing"])
def test_close_in_an_inner_step_or_a_sync_finishes_the_replica(where):
    run = Run(state(3, SEMI)) if where == "inner" else at_sync(3)
    run(ev.Begin())
    if where == "syncing":
        run(ev.PlanArrived(1, 3, plan(3)))
    effects = run(ev.Close("done"))
    assert run.state.phase is Phase.FINISHING and effects[-1] == ev.SendClose(3, "done")
    assert any(isinstance(e, ev.DropGradients) for e in effects) == (where == "syncing")


def test_a_retry_decided_before_this_rank_voted_ends_the_sync_attempt():
    run = at_sync(3)
    run(ev.Begin())
    run(ev.PlanArrived(1, 3, plan(3)))
    run(ev.DecisionArrived(1, False, "replica a lost"))
    assert (run.state.phase, run.state.inner, run.state.failures_in_a_row) == (Phase.IDLE, H, 1)


def test_a_behind_fetch_past_its_budget_makes_the_sync_vote_no():
    run = at_sync(0)
    run(ev.Begin())
    run(ev.PlanArrived(1, 0, plan(5, behind=True)))
    run(ev.Reduced(True))
    effects = run(ev.Tick(), at=100.0 + SEMI.fetch_budget_s)
    assert isinstance(effects[0], ev.CancelFetch) and effects[-1].ok is False
    assert run.state.phase is Phase.VOTING and run.state.fetch is Fetch.FAILED


@pytest.mark.parametrize("phase,event", [
    (Phase.INNER, ev.Reduced(True)), (Phase.INNER, ev.Begin()), (Phase.SYNCING, ev.End()),
    (Phase.SYNCING, ev.Begin()),
])
def test_a_local_event_in_the_wrong_semi_synchronous_phase_is_a_bug_that_changes_nothing(phase, event):
    before = state(3, SEMI, phase=phase, inner=1)
    with pytest.raises(ProtocolError, match=type(event).__name__):
        Run(before)(event)


def test_coordinator_messages_during_inner_steps_are_ignored():
    run = Run(state(3, SEMI))
    run(ev.Begin())
    before = run.state
    assert run(ev.DecisionArrived(7, True, "late")) == () and run.state is before
    assert run(ev.Tick(), at=1e9) == () and run.state is before


def test_the_sync_phases_are_all_in_the_table():
    semi = {(p, e) for p, e in _TABLE if p in (Phase.INNER, Phase.SYNCING)}
    assert semi == {
        (Phase.INNER, ev.End), (Phase.INNER, ev.Close), (Phase.INNER, ev.CoordinatorLost),
        (Phase.SYNCING, ev.Reduced), (Phase.SYNCING, ev.FetchFinished), (Phase.SYNCING, ev.Tick),
        (Phase.SYNCING, ev.PlanArrived), (Phase.SYNCING, ev.PlanRefused), (Phase.SYNCING, ev.DecisionArrived),
        (Phase.SYNCING, ev.Close), (Phase.SYNCING, ev.CoordinatorLost)}


def test_sync_mode_takes_no_inner_step():
    run = Run(state(3))
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))
