"""Pure derivations a rank makes: its plan from the quorum answer, digest days, the data ledger."""

from __future__ import annotations

import pytest

from fthsdp.data_ledger import DataLedger, LedgerBatches
from fthsdp.step.plan import AddressBook, PlanError, address_columns, digest_due, plan_for_rank, without_addresses
from protos import replica_pb2 as rpb
from tests.runtime.protocol_helpers import answer


def _step_plan(a, rank: int) -> rpb.StepPlan:
    """The plan rank `rank` gets from its coordinator for answer `a` (with its address column)."""
    columns = address_columns(a, max(rank + 1, 2))
    return rpb.StepPlan(attempt=1, step=0, quorum=without_addresses(a), peers=columns[rank])


def _plan(replica: str, rank: int, a=None, every: int = 0):
    a = a or answer()
    return plan_for_rank(a, AddressBook().fill(_step_plan(a, rank)), "job", replica, rank, every)


def test_plan_for_a_healthy_rank():
    plan = _plan("a", 1)
    assert (plan.behind, plan.ftar_group_id, plan.ftar_members) == (False, "job/rank1", ("fa1", "fb1", "fc1"))
    assert (plan.included, plan.divisor, plan.fetchers, plan.lr_scale) == (("a", "b"), 2, (), 0.8)
    assert plan.writes_checkpoint_state and not _plan("b", 1).writes_checkpoint_state
    assert _plan("b", 1).fetchers == ("c",)


def test_plan_for_a_behind_rank_fetches_round_robin_from_its_shard_source():
    p0, p1 = _plan("c", 0), _plan("c", 1)
    assert (p0.behind, p0.fetch_from, p1.fetch_from, p0.step, p0.source_replica) == (True, "sa0", "sb1", 5, "a")
    assert p0.report_digest  # a catch-up always ends with a digest


def test_a_diverged_replica_at_max_step_is_behind_all_the_same():
    a = answer(members=(("a", 5, True), ("b", 5, False)), recover=(("b", ("a",)),))
    plan = _plan("b", 0, a)
    assert plan.behind and plan.step == 5 and plan.fetch_from == "sa0"


def test_each_rank_gets_only_its_column_and_keeps_it_for_plans_without():
    columns = address_columns(answer(), 2)
    assert [list(c.ftar_addresses) for c in columns] == [["fa0", "fb0", "fc0"], ["fa1", "fb1", "fc1"]]
    assert not any(m.ftar_addresses for m in without_addresses(answer()).members)
    book = AddressBook()
    book.fill(_step_plan(answer(), 1))
    bare = rpb.StepPlan(attempt=2, step=0, quorum=answer(addresses=False))
    plan = plan_for_rank(bare.quorum, book.fill(bare), "job", "a", 1, 0)
    assert plan.ftar_members == ("fa1", "fb1", "fc1")
    with pytest.raises(PlanError, match=r"came without the addresses of \['a', 'b', 'c'\]"):
        AddressBook().fill(bare)


@pytest.mark.parametrize("a, replica, rank, message", [
    (answer(), "z", 0, "replica z is not among quorum 9's members"),
    (answer(), "a", 2, "lists no address for rank 2"),
    (answer(members=(("a", 5, False),), recover=()), "a", 0, "has no healthy member"),
    (answer(recover=()), "c", 0, "behind in quorum 9 but has no source"),
    (answer(recover=(("c", ("c",)),)), "c", 0, "source c of replica c is not a healthy member"),
    (answer(lr_scale=float("nan")), "a", 0, "lr_scale nan"),
    (answer(quorum_id=0), "a", 0, "quorum_id 0"),
])
def test_plans_that_do_not_fit_name_what(a, replica, rank, message):
    with pytest.raises(PlanError, match=message):
        _plan(replica, rank, a)


@pytest.mark.parametrize("a, replica, every, due", [
    (answer(max_step=5), "a", 0, True),           # a is a catch-up source this step
    (answer(max_step=5, recover=()), "a", 0, False),
    (answer(max_step=5, recover=()), "a", 6, True),  # step 5 committed: the 6th step
    (answer(max_step=5, recover=()), "a", 4, False),
    (answer(max_step=5), "c", 0, True),           # c catches up
])
def test_digest_days_are_the_same_for_every_replica(a, replica, every, due):
    assert digest_due(a, replica, every) is due


def test_a_zero_lr_scale_means_unscaled():
    assert _plan("a", 0, answer(lr_scale=0.0)).lr_scale == 1.0


def test_ledger_advances_included_replicas_once_each():
    ledger = DataLedger({"a": 2}).advanced(["a", "b", "b"])
    assert ledger.positions == {"a": 3, "b": 1}
    assert DataLedger.from_json(ledger.to_json()) == ledger
    assert ledger.advanced([]).positions == ledger.positions
    # a semi-synchronous sync commits each contributor's H inner-step batches at once
    assert ledger.advanced(["b"], 8).positions == {"a": 3, "b": 9}


@pytest.mark.parametrize("text", ['{"positions": {"a": -1}}', "[]", '{"positions": {"a": "x"}}', "nope",
                                  '{"positions": {"a": true}}', '{"positions": {"": 1}}'])
def test_ledger_rejects_bad_json(text):
    with pytest.raises(ValueError):
        DataLedger.from_json(text)


def test_ledger_batches_repeat_until_commit_and_end_when_begin_says_so():
    ledger, more = DataLedger(), [True, True, True, False]
    batches = LedgerBatches(lambda: ledger, "r1", lambda r, p: f"{r}/{p}", lambda: more.pop(0))
    assert [next(batches), next(batches)] == ["r1/0", "r1/0"]
    ledger = ledger.advanced(["r1"])
    assert next(batches) == "r1/1"
    with pytest.raises(StopIteration):
        next(batches)
