"""The rank step protocol, transition by transition, every timeout on a fake clock (no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.data_ledger import DataLedger
from fthsdp.step import events as ev
from fthsdp.step.protocol import INF, Fetch, Phase, ProtocolError, advance, next_deadline
from tests.runtime.protocol_helpers import SETTINGS, Run, plan, state

S = SETTINGS


def kinds(effects) -> list[str]:
    return [type(e).__name__ for e in effects]


# ---------------------------------------------------------------- begin and plan


def test_begin_serves_the_committed_state_and_asks_for_a_plan():
    run = Run(state(3))
    assert run(ev.Begin()) == (ev.ServeState(3), ev.SendBegin(3))
    assert run.state.phase is Phase.PLANNING
    assert next_deadline(run.state) == 100.0 + S.plan_timeout_s


def test_a_healthy_plan_names_its_fetchers_to_the_state_server_and_configures_the_ring():
    run = Run(state(3))
    assert run.to_training(plan(3)) == (ev.ServeState(3, ()), ev.ConfigureRing(plan(3)))
    run = Run(state(3))
    serving = dataclasses.replace(plan(3), fetchers=("c",))
    assert run.to_training(serving)[0] == ev.ServeState(3, ("c",))  # only c may fetch, and ack
    assert (run.state.phase, run.state.attempt, run.state.fetch) == (Phase.TRAINING, 1, Fetch.NONE)


def test_a_behind_plan_stops_serving_and_fetches_while_training():
    run = Run(state(0))
    p = plan(5, behind=True)
    assert run.to_training(p) == (ev.StopServing(), ev.ConfigureRing(p), ev.StartFetch(p))
    assert run.state.fetch is Fetch.RUNNING
    assert next_deadline(run.state) == 100.0 + S.fetch_budget_s


def test_a_plan_that_could_not_be_derived_makes_the_vote_no():
    run = Run(state(3))
    run(ev.Begin())
    assert run(ev.PlanArrived(1, 3, None, "member c lists no address for rank 0")) == ()
    run(ev.Reduced(False, "no plan for this step"))
    (vote,) = run(ev.End())
    assert (vote.ok, vote.reason) == (False, "member c lists no address for rank 0")


def test_a_healthy_plan_for_another_step_stays_out_of_the_ring_and_votes_no():
    run = Run(state(3))
    run(ev.Begin())
    assert run(ev.PlanArrived(1, 3, plan(4))) == ()  # no ConfigureRing: its gradient must not be summed
    assert run.state.plan is None and "healthy at step 4 but it is at step 3" in run.state.failure


def test_a_plan_answering_another_step_is_fatal():
    run = Run(state(3))
    run(ev.Begin())
    (fail,) = run(ev.PlanArrived(1, 2, plan(3)))
    assert run.state.phase is Phase.FAILED and "ranks disagree on their step" in fail.message


def test_late_and_duplicated_plans_are_ignored():
    run = Run(state(3, attempt=4))
    run(ev.Begin())
    before = run.state
    assert run(ev.PlanArrived(4, 3, plan(3))) == () and run.state is before
    run(ev.PlanArrived(5, 3, plan(3)))
    training = run.state
    assert run(ev.PlanArrived(5, 3, plan(3))) == () and run.state is training


@pytest.mark.parametrize("kind, phase, last", [
    (ev.Refusal.RETRY, Phase.IDLE, "Concluded"),
    (ev.Refusal.FINISHED, Phase.ENDED, "Ended"),
    (ev.Refusal.FATAL, Phase.FAILED, "Fail"),
])
def test_refused_plans(kind, phase, last):
    run = Run(state(3))
    run(ev.Begin())
    effects = run(ev.PlanRefused(1, kind, "controller unreachable"))
    assert run.state.phase is phase and kinds(effects)[-1] == last
    if kind is ev.Refusal.RETRY:
        assert effects[-1].outcome.committed is False and run.state.failures_in_a_row == 1


def test_more_than_max_retries_refusals_in_a_row_give_up():
    run = Run(state(3))
    for attempt in range(1, S.max_retries + 1):
        run(ev.Begin())
        run(ev.PlanRefused(attempt, ev.Refusal.RETRY, "down"))
        assert run.state.phase is Phase.IDLE
    run(ev.Begin())
    (_, fail) = run(ev.PlanRefused(S.max_retries + 1, ev.Refusal.RETRY, "down"))
    assert fail.retries_exhausted and "failed 3 times in a row, more than max_retries=2" in fail.message
    assert run.state.phase is Phase.FAILED


def test_no_answer_within_the_plan_timeout_is_fatal():
    run = Run(state(3))
    run(ev.Begin())
    assert run(ev.Tick(), at=100.0 + S.plan_timeout_s - 0.01) == ()
    (fail,) = run(ev.Tick(), at=100.0 + S.plan_timeout_s)
    assert run.state.phase is Phase.FAILED and "no answer from its coordinator" in fail.message


def test_a_retry_decided_without_this_rank_ends_its_wait_for_a_plan():
    """Its plan got lost; the attempt cannot have committed without its vote."""
    run = Run(state(3, attempt=2))
    run(ev.Begin())
    effects = run(ev.DecisionArrived(3, False, "1 rank(s) did not vote"))
    assert run.state.phase is Phase.IDLE and run.state.attempt == 3 and kinds(effects) == ["Concluded"]
    run2 = Run(state(3, attempt=2))
    run2(ev.Begin())
    run2(ev.DecisionArrived(3, True, "all voted"))
    assert run2.state.phase is Phase.FAILED


def test_max_steps_ends_the_replica():
    settings = dataclasses.replace(S, max_steps=3)
    run = Run(state(3, settings=settings))
    assert run(ev.Begin()) == (ev.Ended("max_steps=3 reached"),)
    assert run(ev.Begin()) == (ev.Ended("max_steps=3 reached"),) and run.state.phase is Phase.ENDED
    assert kinds(run(ev.Close())) == ["SendClose"] and run.state.phase is Phase.FINISHING


# ---------------------------------------------------------------- training and voting


def test_a_successful_reduction_votes_yes_with_loss_and_tokens():
    run = Run(state(3))
    (vote,) = run.to_voting(plan(3))
    assert vote == ev.SendVote(1, True, "", 0.5, 8)
    assert run.state.phase is Phase.VOTING and next_deadline(run.state) == 100.0 + S.decision_timeout_s


def test_the_first_failure_is_the_vote():
    run = Run(state(3))
    run.to_training(plan(3))
    run(ev.Reduced(False, "FTAR peer died"))
    run(ev.Reduced(False, "second bucket"))
    (vote,) = run(ev.End())
    assert (vote.ok, vote.reason) == (False, "FTAR peer died")


def test_end_waits_for_the_fetch_then_votes():
    run = Run(state(0))
    p = plan(5, behind=True)
    run.to_training(p)
    run(ev.Reduced(True))
    assert run(ev.End(0.1, 3)) == () and run.state.ending
    effects = run(ev.FetchFinished(True, "", DataLedger({"a": 5, "b": 2})))
    assert effects == (ev.SendVote(1, True, "", 0.1, 3),)
    assert run.state.step == 0  # the fetched state becomes its own only when the step commits


def test_a_failed_fetch_votes_no():
    run = Run(state(0))
    run.to_training(plan(5, behind=True))
    run(ev.FetchFinished(False, "checksum mismatch"))
    run(ev.Reduced(True))
    (vote,) = run(ev.End())
    assert (vote.ok, vote.reason, run.state.step) == (False, "checksum mismatch", 0)


def test_a_fetch_past_its_budget_is_cancelled_and_votes_no():
    run = Run(state(0))
    run.to_training(plan(5, behind=True))
    run(ev.Reduced(True))
    run(ev.End())
    budget_end = 100.0 + S.fetch_budget_s
    assert run(ev.Tick(), at=budget_end - 0.01) == ()
    cancel, vote = run(ev.Tick(), at=budget_end)
    assert isinstance(cancel, ev.CancelFetch) and not vote.ok and "did not finish within 10s" in vote.reason


def test_commit_applies_the_step_and_advances_step_and_ledger():
    run = Run(state(3))
    p = plan(3)
    run.to_voting(p)
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert kinds(effects) == ["StopServing", "ApplyStep", "Concluded"]
    assert effects[0] == ev.StopServing((), 0.0) and effects[1] == ev.ApplyStep(p)
    assert (run.state.phase, run.state.step, run.state.ledger.positions) == (Phase.IDLE, 4, {"a": 4, "b": 4})
    assert effects[2].outcome.positions_before == {"a": 3, "b": 3}


def test_a_source_holds_its_step_for_its_fetchers_and_reports_a_digest():
    run = Run(state(3))
    run.to_voting(plan(3, fetchers=("c",)))
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert effects[0] == ev.StopServing(("c",), S.fetch_hold_timeout_s)
    assert ev.SendDigest(1, 3) in effects


def test_a_caught_up_commit_adopts_the_fetched_state_first_and_reports_a_digest():
    run = Run(state(0))
    p = plan(5, behind=True)
    run.to_voting(p)
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert effects[:3] == (ev.StopServing(), ev.AdoptFetched(5), ev.ApplyStep(p)) and ev.SendDigest(1, 5) in effects
    assert (run.state.step, run.state.ledger.positions) == (6, {"a": 8, "b": 2})  # b was not included
    assert effects[3].outcome.positions_before == {"a": 7, "b": 2}  # the source's ledger


def test_a_retried_catch_up_leaves_every_rank_at_its_old_step():
    run = Run(state(0))
    run.to_voting(plan(5, behind=True))
    effects = run(ev.DecisionArrived(1, False, "rank 1's fetch failed"))
    assert kinds(effects) == ["CancelFetch", "DropGradients", "Concluded"]  # the staged state is dropped
    assert (run.state.step, run.state.ledger.positions) == (0, {"a": 0, "b": 0})


def test_a_rank_torn_by_a_catch_up_that_never_committed_serves_nobody_and_trains_nothing():
    # A fetch writes the model and optimizer tensors in place. This one broke off half-way and the
    # step retried; then the sources went away, so the next quorum calls the replica healthy at its
    # own step. Its state is neither that step's nor the source's: it must not be served, nor
    # trained on and summed into other replicas' gradients.
    run = Run(state(0))
    run.to_training(plan(5, behind=True))
    run(ev.FetchFinished(False, "state stream ended after 1048576 of 8388608 bytes"))
    run(ev.Reduced(True))
    run(ev.End())
    run(ev.DecisionArrived(1, False, "rank 0's fetch failed"))
    assert run.state.step == 0
    assert run(ev.Begin()) == (ev.SendBegin(0),)  # no ServeState: nobody may fetch a torn state
    assert run(ev.PlanArrived(2, 0, plan(0))) == ()  # no ConfigureRing: no gradient from a torn state
    run(ev.Reduced(False, "no ring for this step"))
    (vote,) = run(ev.End())
    assert not vote.ok and "partly overwritten by a catch-up that never committed" in vote.reason
    run(ev.DecisionArrived(2, False, "rank 0 voted no"))
    # A source is back: behind again, this fetch commits, and the rank is whole again.
    run.to_voting(plan(5, behind=True), attempt=3)
    effects = run(ev.DecisionArrived(3, True, "all yes"))
    assert ev.AdoptFetched(5) in effects and (run.state.step, run.state.torn) == (6, False)
    assert run(ev.Begin())[0] == ev.ServeState(6)


def test_a_checkpoint_loaded_over_a_torn_state_makes_it_whole():
    run = Run(state(2, torn=True))
    run(ev.Begin())
    assert run(ev.ResumeOrdered(1, 2, 9, 4)) == (ev.StopServing(), ev.LoadCheckpoint(5))
    run(ev.CheckpointLoaded(5, DataLedger({"a": 5, "b": 5})))
    assert (run.state.step, run.state.torn) == (5, False)
    assert run(ev.Begin())[0] == ev.ServeState(5)


@pytest.mark.parametrize("rank, every, writes, expected", [
    (0, 4, True, [ev.Checkpoint(4, True)]), (0, 4, False, [ev.Checkpoint(4, False)]),
    (1, 4, True, [ev.Checkpoint(4, True)]), (0, 3, True, []), (0, 0, True, []),
])
def test_every_rank_gets_the_checkpoint_every_n_steps(rank, every, writes, expected):
    settings = dataclasses.replace(S, rank=rank, checkpoint_every_steps=every, checkpoint_dir="/tmp/x" if every else "")
    run = Run(state(3, settings=settings))
    run.to_voting(plan(3, writes=writes))
    effects = run(ev.DecisionArrived(1, True, "yes"))
    assert [e for e in effects if isinstance(e, ev.Checkpoint)] == expected


def test_retry_drops_gradients_and_counts():
    run = Run(state(3))
    run.to_voting(plan(3))
    effects = run(ev.DecisionArrived(1, False, "rank 1 voted no: peer died"))
    assert kinds(effects) == ["DropGradients", "Concluded"]
    assert (run.state.phase, run.state.step, run.state.failures_in_a_row) == (Phase.IDLE, 3, 1)


def test_a_commit_resets_the_retry_count():
    run = Run(state(3, failures_in_a_row=2))
    run.to_voting(plan(3))
    run(ev.DecisionArrived(1, True, "yes"))
    assert run.state.failures_in_a_row == 0


def test_stale_decisions_are_ignored_while_voting():
    run = Run(state(3, attempt=6))
    run.to_voting(plan(3), attempt=7)
    before = run.state
    assert run(ev.DecisionArrived(6, False, "old")) == () and run.state is before


def test_no_decision_after_voting_is_fatal_not_guessed():
    run = Run(state(3))
    run.to_voting(plan(3))
    deadline = run.state.deadline
    assert run(ev.Tick(), at=deadline - 0.01) == ()
    (fail,) = run(ev.Tick(), at=deadline)
    assert run.state.phase is Phase.FAILED and "cannot know whether its replica committed" in fail.message


def test_a_commit_of_a_no_vote_is_fatal():
    run = Run(state(3))
    run.to_voting(plan(3), ok=False, reason="peer died")
    (fail,) = run(ev.DecisionArrived(1, True, "yes"))
    assert run.state.phase is Phase.FAILED and "voted no" in fail.message


def test_an_early_retry_while_training_concludes_the_attempt():
    run = Run(state(0))
    run.to_training(plan(5, behind=True))
    effects = run(ev.DecisionArrived(1, False, "rank 1 voted no"))
    assert kinds(effects) == ["CancelFetch", "DropGradients", "Concluded"] and run.state.phase is Phase.IDLE


def test_an_early_commit_while_training_is_fatal():
    run = Run(state(3))
    run.to_training(plan(3))
    (fail,) = run(ev.DecisionArrived(1, True, "yes"))
    assert run.state.phase is Phase.FAILED and "before rank 0 voted" in fail.message


def test_a_newer_answer_while_training_means_the_attempt_ended_without_this_rank():
    run = Run(state(3))
    run.to_training(plan(3))
    run(ev.PlanRefused(2, ev.Refusal.RETRY, "ranks 1 did not begin"))
    assert run.state.phase is Phase.IDLE and run.state.failures_in_a_row == 1


# ---------------------------------------------------------------- losing the coordinator, finishing


@pytest.mark.parametrize("to", ["idle", "planning", "training", "voting"])
def test_losing_the_coordinator_is_fatal(to):
    run = Run(state(3))
    if to != "idle":
        run(ev.Begin())
    if to in ("training", "voting"):
        run(ev.PlanArrived(1, 3, plan(3)))
    if to == "voting":
        run(ev.Reduced(True))
        run(ev.End())
    effects = run(ev.CoordinatorLost("connection reset"))
    assert run.state.phase is Phase.FAILED and "lost its coordinator" in effects[-1].message


def test_close_waits_for_the_coordinators_last_word():
    run = Run(state(3))
    assert run(ev.Close("done")) == (ev.SendClose(3, "done"),)
    assert run(ev.Close("again")) == ()
    assert run(ev.FinishedArrived(True, "reported")) == (ev.Closed(True, "reported"),)
    assert run.state.phase is Phase.FINISHED and run(ev.Close()) == ()


def test_close_during_a_step_abandons_it():
    run = Run(state(0))
    run.to_training(plan(5, behind=True))
    assert kinds(run(ev.Close())) == ["CancelFetch", "DropGradients", "SendClose"]


@pytest.mark.parametrize("event, at", [(ev.Tick(), 100.0 + S.finish_timeout_s), (ev.CoordinatorLost("reset"), 100.0)])
def test_finishing_without_the_last_word_closes_uncleanly(event, at):
    run = Run(state(3))
    run(ev.Close())
    (closed,) = run(event, at=at)
    assert closed.clean is False and run.state.phase is Phase.FINISHED


def test_after_a_failure_begin_raises_again_and_close_tears_down():
    run = Run(state(3, phase=Phase.FAILED, reason="rank 0 is gone"))
    assert run(ev.Begin()) == (ev.Fail("rank 0 is gone"),)
    assert run(ev.Close()) == (ev.Closed(False, "rank 0 is gone"),)


# ---------------------------------------------------------------- illegal local events


@pytest.mark.parametrize("phase, event", [
    (Phase.IDLE, ev.Reduced(True)), (Phase.IDLE, ev.End()), (Phase.IDLE, ev.FetchFinished(True)),
    (Phase.PLANNING, ev.Begin()), (Phase.PLANNING, ev.End()), (Phase.VOTING, ev.End()),
    (Phase.VOTING, ev.Reduced(True)), (Phase.FINISHED, ev.Begin()), (Phase.TRAINING, ev.FetchFinished(True)),
])
def test_an_illegal_event_raises_and_changes_nothing(phase, event):
    before = state(3, phase=phase, plan=plan(3), deadline=INF)
    snapshot = dataclasses.replace(before)
    with pytest.raises(ProtocolError, match="rank 0"):
        advance(before, event, 100.0)
    assert before == snapshot


def test_end_before_the_reduction_is_a_usage_error():
    run = Run(state(3))
    run.to_training(plan(3))
    with pytest.raises(ProtocolError, match="sync_gradients first"):
        run(ev.End())
    assert run.state.phase is Phase.TRAINING
