"""Digests in the controller core on a fake clock: mismatch → DIVERGED → re-sync → HEALTHY."""

import copy
import json

import pytest

from controller.core.errors import InvalidArgument
from controller.core.model import JoinRequest, ReplicaState
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored

A, B = "a0" * 8, "b1" * 8
SETTINGS = ControllerSettings(replicas=3, min_replicas=2, join_timeout_s=2.0, heartbeat_timeout_s=10.0,
                              digest_wait_s=5.0)


def form(state, steps, now):
    for rid, step in steps.items():
        state.join(JoinRequest(rid, step, 2), now)
    return state.close_round(now)


def commit(state, digests, step, now, **kw):
    for rid, digest in digests.items():
        state.report(rid, step, now, quorum_id=state.view.replicas[rid].given_quorum_id, digest=digest, **kw)


def states(state):
    return {rid: r.state for rid, r in state.view.replicas.items()}


def mismatches(state):
    return [e for e in state.view.events if e.kind == "digest_mismatch"]


def diverged_r1():
    s = Driver(SETTINGS)
    first = form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    commit(s, {"r0": A, "r1": B}, 0, 1.0)
    assert not mismatches(s)  # r2 has not reported step 0 yet: nothing decided
    commit(s, {"r2": A}, 0, 1.1)
    return s, first


def test_minority_digest_makes_the_replica_diverged_with_one_event():
    s, _ = diverged_r1()
    assert states(s) == {"r0": ReplicaState.HEALTHY, "r1": ReplicaState.DIVERGED, "r2": ReplicaState.HEALTHY}
    [event] = mismatches(s)
    assert f"r0, r2 hold {A}" in event.message and f"r1 holds {B}" in event.message
    assert event.subject == "r1" and s.view.digest_mismatches == 1
    assert "held by r0, r2" in s.view.replicas["r1"].reason
    assert (s.view.replicas["r1"].digest, s.view.replicas["r1"].digest_step) == (B, 0)


def test_diverged_member_is_not_healthy_next_quorum_then_resyncs():
    s, first = diverged_r1()
    heal = form(s, {"r0": 1, "r1": 1, "r2": 1}, 2.0)
    assert heal.reason.startswith("fast path")  # the round still closes at once ...
    assert heal.quorum_id == first.quorum_id + 1  # ... but with new rings
    assert {m.replica_id: m.healthy for m in heal.members} == {"r0": True, "r1": False, "r2": True}
    assert heal.recover == {"r1": ("r0", "r2")}
    assert heal.lr_scale == pytest.approx((2 / 3) ** 0.5)
    assert s.view.replicas["r1"].state == ReplicaState.DIVERGED and "re-syncing in quorum" in s.view.replicas["r1"].reason
    commit(s, {"r0": A, "r2": A}, 1, 3.0)
    commit(s, {"r1": A}, 1, 3.0, caught_up=True)
    assert s.view.replicas["r1"].state == ReplicaState.HEALTHY
    assert s.view.replicas["r1"].reason == "re-synced from r0, r2 and committed step 1"
    after = form(s, {"r0": 2, "r1": 2, "r2": 2}, 4.0)
    assert after.quorum_id == heal.quorum_id and all(m.healthy for m in after.members)
    assert len(mismatches(s)) == 1


def test_a_resync_that_still_disagrees_stays_diverged():
    s, _ = diverged_r1()
    form(s, {"r0": 1, "r1": 1, "r2": 1}, 2.0)
    commit(s, {"r0": A}, 1, 3.0)
    commit(s, {"r1": B}, 1, 3.0, caught_up=True)
    assert s.view.replicas["r1"].state == ReplicaState.DIVERGED and "still differs" in s.view.replicas["r1"].reason
    commit(s, {"r2": A}, 1, 3.1)
    assert len(mismatches(s)) == 2 and s.view.digest_mismatches == 2


def test_without_the_catch_up_flag_a_diverged_replica_stays_diverged():
    s, _ = diverged_r1()
    form(s, {"r0": 1, "r1": 1, "r2": 1}, 2.0)
    commit(s, {"r0": "", "r1": "", "r2": ""}, 1, 3.0)
    assert s.view.replicas["r1"].state == ReplicaState.DIVERGED
    again = form(s, {"r0": 2, "r1": 2, "r2": 2}, 4.0)
    assert [m.replica_id for m in again.members if not m.healthy] == ["r1"]


def test_a_tie_of_two_keeps_the_lowest_replica_id_and_names_both():
    s = Driver(ControllerSettings(replicas=2, min_replicas=1))
    form(s, {"r0": 0, "r1": 0}, 0.0)
    commit(s, {"r1": B, "r0": A}, 0, 1.0)
    [event] = mismatches(s)
    assert f"r0 holds {A}" in event.message and f"r1 holds {B}" in event.message
    assert "lowest replica id" in event.message
    assert states(s) == {"r0": ReplicaState.HEALTHY, "r1": ReplicaState.DIVERGED}
    assert "lowest replica id" in s.view.replicas["r1"].reason


def test_a_missing_report_is_not_waited_for_past_digest_wait_s():
    s = Driver(SETTINGS)
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    commit(s, {"r0": A, "r1": A, "r2": ""}, 0, 1.0)  # r2 sent no digest: the step waits for nobody
    assert not mismatches(s) and len(s.view.digest_ledger) == 1
    form(s, {"r0": 1, "r1": 1, "r2": 1}, 1.5)
    s.report("r0", 1, 2.0, quorum_id=s.view.replicas["r0"].given_quorum_id, digest=A)
    s.report("r1", 1, 2.0, quorum_id=s.view.replicas["r1"].given_quorum_id, digest=B)
    s.tick(6.9)
    assert not mismatches(s)  # r2 may still report step 1
    s.beat_replicas(["r0", "r1", "r2"], 7.0)
    s.tick(7.0)
    [event] = mismatches(s)
    assert "step 1" in event.message and s.view.replicas["r1"].state == ReplicaState.DIVERGED
    late = s.view.replicas["r2"].given_quorum_id
    s.report("r2", 1, 8.0, quorum_id=late, digest=B)  # late: judged against the reference that stands
    assert len(mismatches(s)) == 2 and s.view.replicas["r2"].state == ReplicaState.DIVERGED


def test_without_a_reference_member_the_diverged_one_carries_on():
    s = Driver(ControllerSettings(replicas=2, min_replicas=1))
    form(s, {"r0": 0, "r1": 0}, 0.0)
    commit(s, {"r0": A, "r1": B}, 0, 1.0)
    s.report_dead("r0", "host lost", 1.5)
    q = form(s, {"r1": 1}, 2.0)
    assert [m.healthy for m in q.members] == [True] and "no member holds the reference state" in q.reason
    assert s.view.replicas["r1"].state == ReplicaState.HEALTHY and "goes on from r1's state" in s.view.replicas["r1"].reason


def test_a_diverged_replica_late_for_a_round_keeps_its_mark():
    s, _ = diverged_r1()
    form(s, {"r0": 1, "r2": 1}, 2.0)
    s.beat_replicas(["r1"], 2.0)
    q = s.close_round(4.0)
    assert q.member_ids == {"r0", "r2"} and s.view.replicas["r1"].state == ReplicaState.DIVERGED


def test_divergence_survives_a_failover():
    s, _ = diverged_r1()
    t = Driver.restored(SETTINGS, *stored(s), 50.0)
    assert t.view.replicas["r1"].state == ReplicaState.DIVERGED and t.view.digest_mismatches == 1
    assert t.view.replicas["r1"].digest == B
    q = form(t, {"r0": 1, "r1": 1, "r2": 1}, 51.0)
    assert q.recover == {"r1": ("r0", "r2")}


@pytest.mark.parametrize("digest, message", [
    ("ab" * 100, "is 200 characters; it must be 8..128 hex digits"),
    ("not-a-hex-digest", "not hexadecimal"),
    ("1234", "is 4 characters"),
])
def test_bad_digest_is_refused_and_changes_nothing(digest, message):
    s = Driver(SETTINGS)
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    before = copy.deepcopy((s.view.snapshot_replicas(), len(s.view.digest_ledger), len(s.view.events)))
    with pytest.raises(InvalidArgument, match=message):
        s.report("r0", 0, 1.0, quorum_id=s.view.replicas["r0"].given_quorum_id, digest=digest)
    assert copy.deepcopy((s.view.snapshot_replicas(), len(s.view.digest_ledger), len(s.view.events))) == before


def failed_over(s, now):
    t = Driver.restored(SETTINGS, *stored(s), now)
    return t


def test_a_digest_comparison_pending_at_a_failover_is_decided_by_the_successor():
    """Race 4 of issue 28: r0 and r1 reported step 0 (they differ), r2 had not; the leader dies."""
    s = Driver(SETTINGS)
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    commit(s, {"r0": A, "r1": B}, 0, 1.0)
    assert not mismatches(s)
    t = failed_over(s, 50.0)
    commit(t, {"r2": A}, 0, 50.5)  # the last report reaches the new leader
    [event] = mismatches(t)
    assert f"r0, r2 hold {A}" in event.message and f"r1 holds {B}" in event.message
    assert t.view.replicas["r1"].state == ReplicaState.DIVERGED


def test_a_pending_comparison_waits_its_bound_anew_after_a_failover():
    s = Driver(SETTINGS)
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    commit(s, {"r0": A, "r1": B}, 0, 1.0)
    t = failed_over(s, 50.0)
    t.tick(54.9)  # r2 may still report step 0: it is waited for, digest_wait_s from the takeover
    assert not mismatches(t)
    t.tick(55.0)
    assert len(mismatches(t)) == 1 and "no majority" in mismatches(t)[0].message


def test_a_decided_reference_survives_a_failover_for_late_reports():
    s, _ = diverged_r1()
    t = failed_over(s, 50.0)
    assert t.view.digest_ledger.expected(0, []) == A


def test_a_diverged_replica_that_restarts_with_a_new_incarnation_still_re_syncs():
    """Race 4 of issue 28: the restart used to forget the divergence (DEAD, then JOINING)."""
    s, _ = diverged_r1()
    s.join(JoinRequest("r1", 1, 2, incarnation="r1-a"), 2.0)
    s.join(JoinRequest("r1", 1, 2, incarnation="r1-new"), 2.1)  # r1's leader restarted, its state at step 1
    assert s.view.replicas["r1"].state != ReplicaState.DIVERGED and s.view.replicas["r1"].must_resync
    t = failed_over(s, 3.0)  # and a failover on top: the mark is durable
    q = form(t, {"r0": 1, "r1": 1, "r2": 1}, 4.0)
    assert q.recover == {"r1": ("r0", "r2")} and t.view.replicas["r1"].state == ReplicaState.DIVERGED
    commit(t, {"r0": A, "r2": A}, 1, 5.0)
    commit(t, {"r1": A}, 1, 5.0, caught_up=True)
    assert t.view.replicas["r1"].state == ReplicaState.HEALTHY and not t.view.replicas["r1"].must_resync


def test_the_ledger_snapshot_keeps_the_newest_steps_that_fit():
    from controller.core.digests import DigestLedger
    ledger = DigestLedger(16, 5.0)
    for step in range(10):
        ledger.record("r0", step, A, 0.0)
    whole = ledger.snapshot(1 << 20)
    assert [item[0] for item in whole] == list(range(10))
    part = ledger.snapshot(3 * (80 + len("r0") + len(A) + 12) + 2)
    assert [item[0] for item in part] == [7, 8, 9] and ledger.snapshot(0) == []
    assert len(json.dumps(part)) <= 3 * (80 + len("r0") + len(A) + 12) + 2  # the count is from above
