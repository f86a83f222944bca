"""Table tests for the runtime's pure decisions: 2PC tally, retries, ledger, lr, plans."""

from __future__ import annotations

import math
import random

import pytest

from fthsdp.commit_votes import Outcome, Vote, tally_votes
from fthsdp.data_ledger import DataLedger, LedgerBatches
from fthsdp.lr_policy import lr_scale
from fthsdp.retry_policy import RetryState, after_commit, after_failure
from fthsdp.settings import RuntimeSettings
from fthsdp.step_plan import MemberView, PlanError, QuorumView, plan_for_rank

Y = lambda r, q=7, s=3: Vote(r, q, s, True)  # noqa: E731
N = lambda r, why="peer died": Vote(r, 7, 3, False, why)  # noqa: E731


@pytest.mark.parametrize("votes, world, deadline, outcome, reason", [
    ({0: Y(0), 1: Y(1)}, 2, False, Outcome.COMMIT, "all 2 ranks voted yes"),
    ({0: Y(0)}, 1, False, Outcome.COMMIT, "all 1 ranks"),
    ({0: Y(0)}, 2, False, Outcome.PENDING, "waiting for 1 vote"),
    ({0: Y(0)}, 2, True, Outcome.RETRY, "did not vote in time: 1"),
    ({0: Y(0), 1: N(1)}, 3, False, Outcome.RETRY, "rank 1 voted no: peer died"),
    ({1: N(1, "")}, 2, False, Outcome.RETRY, "no reason given"),
    ({0: Y(0), 1: Y(1, q=6)}, 2, False, Outcome.RETRY, "rank 1 voted for quorum 6"),
    ({0: Y(0), 1: Y(1, s=2)}, 2, False, Outcome.RETRY, "step 2, not quorum 7 step 3"),
    ({}, 8192, True, Outcome.RETRY, "8192 rank(s) did not vote in time: 0, 1, 2, 3, 4 ..."),
])
def test_tally(votes, world, deadline, outcome, reason):
    decision = tally_votes(votes, world, 7, 3, deadline)
    assert decision.outcome is outcome
    assert reason in decision.reason


def test_tally_matches_naive_reference_on_random_votes():
    rng = random.Random(4)
    for _ in range(500):
        world = rng.randint(1, 6)
        votes = {r: Vote(r, 7, rng.choice([3, 3, 3, 2]), rng.random() > 0.2)
                 for r in range(world) if rng.random() > 0.15}
        deadline = rng.random() > 0.5
        all_good = all(v.ok and v.step == 3 for v in votes.values())
        expected = (Outcome.COMMIT if all_good and len(votes) == world else
                    Outcome.RETRY if not all_good or deadline else Outcome.PENDING)
        assert tally_votes(votes, world, 7, 3, deadline).outcome is expected


@pytest.mark.parametrize("max_retries, failures, gives_up_at", [(0, 1, 1), (2, 5, 3), (5, 5, None)])
def test_retry_policy_gives_up_after_max_retries_in_a_row(max_retries, failures, gives_up_at):
    state, gave_up = RetryState(), None
    for i in range(1, failures + 1):
        state, stop = after_failure(state, f"failure {i}", max_retries)
        if stop:
            gave_up = i
            break
    assert gave_up == gives_up_at


def test_a_commit_resets_the_retry_count():
    state, _ = after_failure(RetryState(), "x", 1)
    state = after_commit(state)
    state, stop = after_failure(state, "y", 1)
    assert (state.failures_in_a_row, stop) == (1, False)


def test_ledger_advances_included_replicas_once_each():
    ledger = DataLedger({"a": 2}).advanced(["a", "b", "b"])
    assert ledger.positions == {"a": 3, "b": 1}
    assert DataLedger.from_json(ledger.to_json()) == ledger
    assert ledger.advanced([]).positions == ledger.positions


@pytest.mark.parametrize("text", ['{"positions": {"a": -1}}', "[]", '{"positions": {"a": "x"}}', "nope"])
def test_ledger_rejects_bad_json(text):
    with pytest.raises(ValueError):
        DataLedger.from_json(text)


def test_ledger_batches_repeat_until_commit():
    ledger = DataLedger()
    batches = LedgerBatches(lambda: ledger, "r1", lambda r, p: f"{r}/{p}")
    assert [next(batches), next(batches)] == ["r1/0", "r1/0"]
    ledger = ledger.advanced(["r1"])
    assert next(batches) == "r1/1"


@pytest.mark.parametrize("policy, healthy, total, quorum, expected", [
    ("quorum", 2, 3, 0.5, 0.5), ("quorum", 2, 3, 0.0, 1.0), ("none", 1, 3, 0.5, 1.0),
    ("linear", 2, 4, 0.0, 0.5), ("sqrt", 1, 4, 0.0, 0.5), ("sqrt", 3, 3, 0.0, 1.0),
    ("sqrt", 2, 3, 0.0, math.sqrt(2 / 3)),
])
def test_lr_policies(policy, healthy, total, quorum, expected):
    assert lr_scale(policy, healthy, total, quorum) == pytest.approx(expected)


def test_lr_policy_rejects_unknown_names_and_counts():
    with pytest.raises(ValueError, match="unknown lr policy 'cosine'"):
        lr_scale("cosine", 1, 2, 1.0)
    with pytest.raises(ValueError, match="healthy=0"):
        lr_scale("sqrt", 0, 2, 1.0)


def _view() -> QuorumView:
    m = lambda rid, step, ok: MemberView(rid, step, ok, (f"f{rid}0", f"f{rid}1"), (f"s{rid}0", f"s{rid}1"))  # noqa: E731
    return QuorumView(9, 5, 5, (m("a", 5, True), m("b", 5, True), m("c", 0, False)),
                      {"c": ("a", "b")}, 0.8, 3)


def test_plan_for_a_healthy_rank():
    plan = plan_for_rank(_view(), "job", "a", 1)
    assert (plan.behind, plan.ftar_group_id, plan.ftar_members) == (False, "job/rank1", ("fa1", "fb1", "fc1"))
    assert (plan.included, plan.divisor, plan.fetchers) == (("a", "b"), 2, ())
    assert plan_for_rank(_view(), "job", "b", 1).fetchers == ("c",)


def test_plan_for_a_behind_rank_fetches_round_robin():
    p0, p1 = (plan_for_rank(_view(), "job", "c", k) for k in (0, 1))
    assert (p0.behind, p0.fetch_from, p1.fetch_from, p0.step) == (True, "sa0", "sb1", 5)


def test_plan_rejects_a_replica_outside_the_quorum():
    with pytest.raises(PlanError, match="replica z is not among"):
        plan_for_rank(_view(), "job", "z", 0)


def test_view_round_trips_through_json():
    assert QuorumView.from_json(_view().to_json()) == _view()


@pytest.mark.parametrize("field, value, message", [
    ("world_size", 0, "world_size must be between 1 and 8192, got 0"),
    ("rank", 3, "rank must be in [0, world_size=2), got 3"),
    ("lr_policy", "cos", "lr_policy must be one of"),
    ("vote_timeout_s", 0, "vote_timeout_s must be > 0 seconds, got 0"),
    ("checkpoint_every_steps", 5, "checkpoint_dir must be set"),
])
def test_settings_validate_names_bad_values(field, value, message):
    base = dict(controller_address="x:1", world_size=2, leader_address="y:2")
    with pytest.raises(ValueError) as info:
        RuntimeSettings(**{**base, field: value}).validate()
    assert message in str(info.value)
