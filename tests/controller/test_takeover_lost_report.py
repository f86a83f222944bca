"""A commit report lost with a deposed leader must not end its replica (found by bench.chaos
seed 21): every replica committed step s in a fast-path round (the quorum id unchanged, so
nothing was written for the round), its report of s died with the old leader, and the new
leader -- whose durable history ends at s - 1 -- refused the join for s + 1 as "beyond the
job's history". Every replica died that way, all hosts were cordoned and the job FAILED.

A member of the current quorum may ask for one step more than anyone else (its report of the
step after the durable history may have been lost); a newcomer still may not (attack 4)."""

from __future__ import annotations

import pytest

from controller.core.errors import FailedPrecondition
from controller.core.model import JoinRequest
from tests.controller.test_takeover_state import running_job
from tests.controller.drive import Driver, stored

REPLICAS = ("r0", "r1", "r2")


def durable_after_lost_report(through: int):
    """r0..r2 train steps 0..through in one quorum; the reports of 0..through-1 are written,
    the round of `through` is a fast path (nothing to write) and its commit's report is lost.
    Returns what the store holds then (the old leader dies)."""
    s = running_job()
    for step in range(through + 1):
        if step:
            for i, rid in enumerate(REPLICAS):
                s.join(JoinRequest(rid, step, 1, host_id=f"h{i}"), 1.0)
            assert s.close_round(1.0) is not None
        if step == through:
            assert s.ready.writes == ()  # the fast path: its answer writes nothing
            return durable
        for i, rid in enumerate(REPLICAS):
            s.report(rid, step, 1.0, quorum_id=s.view.quorum.quorum_id, host_id=f"h{i}")
        durable = stored(s)


def take_over(durable, now):
    t = Driver.restored(running_job().settings, *durable, now)
    t.takeover("b", t.settings.takeover_grace_s, now)
    return t


def test_a_member_whose_last_report_died_with_the_old_leader_joins_the_new_one():
    t = take_over(durable_after_lost_report(5), 10.0)  # 0-4 reported; 5 committed, its report lost
    assert t.view.max_committed_step == 4
    for i, rid in enumerate(REPLICAS):
        t.join(JoinRequest(rid, 6, 1, host_id=f"h{i}"), 11.0)  # refused before the fix
    q = t.close_round(11.0)
    assert q is not None and q.max_step == 6 and {m.replica_id for m in q.members} == set(REPLICAS)
    t.report("r0", 6, 11.0, quorum_id=q.quorum_id, host_id="h0")  # and its commit is taken
    assert t.view.max_committed_step == 6


def test_one_step_more_is_all_a_member_gets_and_a_newcomer_gets_none():
    t = take_over(durable_after_lost_report(5), 10.0)
    with pytest.raises(FailedPrecondition, match="asked to train step 7, beyond the job's history"):
        t.join(JoinRequest("r0", 7, 1, host_id="h0"), 11.0)
    with pytest.raises(FailedPrecondition, match="'zz' is not one of this job's configured replicas"):
        t.join(JoinRequest("zz", 6, 1), 11.0)  # a newcomer is no member (the step bound: test_plausible)
    assert "zz" not in t.view.replicas and not t.view.round_joined


def test_a_report_the_old_leader_stored_sent_again_to_the_new_one_is_taken_once():
    """The coordinator sends a commit report again when its first answer was lost (the old
    leader died after storing it): the new leader takes it as the same report, not as a refusal
    or a second commit."""
    durable = durable_after_lost_report(5)  # 0-4 reported and stored, in one quorum
    t = take_over(durable, 10.0)
    quorum_id = t.view.quorum.quorum_id
    before = t.view.replicas["r0"]
    assert before.committed_step == 4
    state, tokens = before.state, before.tokens
    t.report("r0", 4, 11.0, quorum_id=quorum_id, host_id="h0", tokens=64)  # the stored report, again
    after = t.view.replicas["r0"]
    assert (after.committed_step, after.state, after.tokens) == (4, state, tokens)  # counted once
    assert t.view.max_committed_step == 4
