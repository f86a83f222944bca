"""Replicas and rounds: the controller core driven by commands, on a fake clock (time is an argument)."""

import copy

import pytest

from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.model import JoinRequest, ReplicaState
from controller.core.host_records import HOST_SHARDS
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored

SETTINGS = ControllerSettings(replicas=3, min_replicas=2, join_timeout_s=2.0, heartbeat_timeout_s=10.0)


def fresh(**kw):
    return Driver(ControllerSettings(**{**SETTINGS.__dict__, **kw}) if kw else SETTINGS)


def join(state, rid, step, now, **kw):
    state.join(JoinRequest(rid, step, kw.pop("world_size", 2), **kw), now)


def form(state, steps, now):
    for rid, step in steps.items():
        join(state, rid, step, now)
    return state.close_round(now)


def commit(state, rid, now, **kw):
    """Report the commit of what `rid` was last given (its quorum id and step)."""
    r = state.view.replicas[rid]
    state.report(rid, r.given_step, now, quorum_id=r.given_quorum_id, **kw)


def picture(state):
    return copy.deepcopy((*stored(state), dict(state.view.round_joined)))


def test_first_quorum_and_fast_path():
    s = fresh()
    q = form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    assert q.quorum_id == 1 and q.reason == "all 3 live replicas joined"
    assert {r.state for r in s.view.replicas.values()} == {ReplicaState.HEALTHY}
    for rid in ("r0", "r1", "r2"):
        commit(s, rid, 1.0)
    q2 = form(s, {"r0": 1, "r1": 1, "r2": 1}, 1.0)
    assert q2.quorum_id == 1 and q2.reason.startswith("fast path")


def test_heartbeat_silence_excludes_and_behind_gets_a_source():
    s = fresh()
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    for t in (4.0, 8.0, 12.0):
        s.beat_replicas(["r0", "r1"], t)
    s.tick(10.5)
    assert s.view.replicas["r2"].state == ReplicaState.DEAD
    assert "no heartbeat for 10.5s" in s.view.replicas["r2"].reason
    assert s.view.deaths == {"heartbeat": 1}
    for rid in ("r0", "r1"):
        commit(s, rid, 11.0)
    q = form(s, {"r0": 1, "r1": 1}, 11.0)
    assert q.quorum_id == 2 and q.member_ids == {"r0", "r1"}
    # r2 comes back at its old step: it is behind and recovers from a healthy replica
    join(s, "r2", 0, 12.0)
    join(s, "r0", 2, 12.0)
    join(s, "r1", 2, 12.0)
    q = s.close_round(12.0)
    assert q.quorum_id == 3 and q.max_step == 2
    assert s.view.replicas["r2"].state == ReplicaState.BEHIND
    assert q.recover == {"r2": ("r0", "r1")}
    commit(s, "r2", 13.0)  # a behind replica commits the quorum's max step
    assert s.view.replicas["r2"].state == ReplicaState.HEALTHY and s.view.replicas["r2"].committed_step == 2


def test_failure_report_excludes_at_once_and_drops_from_round():
    s = fresh()
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    join(s, "r2", 1, 1.0)
    s.report_dead("r2", "NIC down", 1.0)
    assert s.view.replicas["r2"].state == ReplicaState.DEAD and s.view.replicas["r2"].reason == "NIC down"
    assert "r2" not in s.view.round_joined
    q = form(s, {"r0": 1, "r1": 1}, 1.0)
    assert q.member_ids == {"r0", "r1"} and q.reason == "all 2 live replicas joined"


def test_failed_commit_bumps_quorum_id_and_allows_retry():
    s = fresh()
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    s.commit_failed("r1", 0, "FTAR timeout", 1.0, quorum_id=s.view.quorum.quorum_id)
    q = form(s, {"r0": 0, "r1": 0, "r2": 0}, 1.0)
    assert q.quorum_id == 2
    assert not s.view.replicas["r1"].failed_commit


def test_backwards_step_refused_without_failed_commit_and_state_unchanged():
    s = fresh()
    form(s, {"r0": 4, "r1": 4, "r2": 4}, 0.0)
    commit(s, "r0", 1.0)
    before = picture(s)
    with pytest.raises(FailedPrecondition, match="asked to train step 2.*committed step 4"):
        join(s, "r0", 2, 2.0)
    with pytest.raises(FailedPrecondition, match="commit of step 3 in quorum .*last quorum answer was .* at step 4"):
        s.report("r0", 3, 2.0, quorum_id=s.view.quorum.quorum_id)
    assert picture(s) == before


def test_new_incarnation_may_come_back_lower():
    s = fresh(replicas=1, min_replicas=1)
    join(s, "r0", 9, 0.0, incarnation="a")
    s.close_round(0.0)
    commit(s, "r0", 1.0)
    join(s, "r0", 0, 2.0, incarnation="b")
    r = s.view.replicas["r0"]
    assert r.state == ReplicaState.JOINING and r.incarnation == "b" and r.step == 0
    assert s.view.deaths == {"restarted": 1}
    s.close_round(2.0)
    commit(s, "r0", 3.0)  # it resumed from an older checkpoint: its steps count again
    assert r.committed_step == 0


def test_a_fresh_controller_counts_quorum_ids_from_its_clock():
    s = Driver.restored(SETTINGS, None, [], 1234.5)
    q = form(s, {"r0": 0, "r1": 0, "r2": 0}, 1234.5)
    assert q.quorum_id == 1_234_500
    t = Driver.restored(SETTINGS, s.view.snapshot_replicas(), [], 2000.0)  # a successor keeps counting, never restarts
    assert t.view.first_quorum_id == 1_234_500 and t.view.quorum.quorum_id == 1_234_500


@pytest.mark.parametrize("req, message", [
    (JoinRequest("", 0, 2), "replica_id must not be empty"),
    (JoinRequest("r 1", 0, 2), "must start with a letter or digit"),
    (JoinRequest("x" * 200, 0, 2), "the limit is 128"),
    (JoinRequest("r0", -1, 2), "step must not be negative, got -1"),
    (JoinRequest("r0", 0, 0), "world_size must be 1..65536, got 0"),
    (JoinRequest("r0", 0, 2, ftar_addresses=("a",)), "has 1 entries but world_size is 2"),
    (JoinRequest("r0", 0, 1, state_addresses=("x" * 300,)), "must be 1..256 characters"),
])
def test_bad_join_is_refused_and_changes_nothing(req, message):
    s = fresh()
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    before = picture(s)
    with pytest.raises(InvalidArgument, match=message):
        s.join(req, 1.0)
    assert picture(s) == before


def test_unknown_replica_and_negative_numbers_in_reports():
    s = fresh()
    with pytest.raises(FailedPrecondition, match="replica 'ghost' is unknown"):
        s.report("ghost", 0, 0.0, quorum_id=1)
    join(s, "r0", 0, 0.0)
    with pytest.raises(InvalidArgument, match="tokens must not be negative, got -5"):
        s.report("r0", 0, 0.0, tokens=-5, quorum_id=1)
    assert s.view.steps_committed == 0


def test_too_many_replica_ids_refused():
    s = fresh(replicas=1, min_replicas=1)
    for i in range(20):
        join(s, f"r{i}", 0, 0.0)
    with pytest.raises(FailedPrecondition, match="one too many"):
        join(s, "r20", 0, 0.0)


def test_late_replica_becomes_joining_then_returns():
    s = fresh()
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    join(s, "r0", 1, 1.0)
    join(s, "r1", 1, 1.0)
    s.beat_replicas(["r2"], 2.0)
    assert s.close_round(2.0) is None
    q = s.close_round(3.0)
    assert q.member_ids == {"r0", "r1"} and "left out r2" in q.reason
    assert s.view.replicas["r2"].state == ReplicaState.JOINING


def test_snapshot_round_trip():
    s = fresh()
    form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    commit(s, "r0", 1.0)
    t = Driver.restored(SETTINGS, *stored(s), 50.0,
              {"r0": s.view.snapshot_addresses("r0")}, s.view.snapshot_journal())
    assert t.view.quorum == s.view.quorum
    assert t.view.replicas["r0"].committed_step == 0 and t.view.replicas["r0"].last_seen == 50.0
    assert [e.message for e in t.view.events] == [e.message for e in s.view.events]


def test_addresses_are_persisted_apart_and_only_on_change():
    s = fresh()
    join(s, "r0", 0, 0.0, world_size=1, ftar_addresses=("f:1",), state_addresses=("s:1",))
    assert "addresses/r0" in s.ready.writes
    join(s, "r0", 0, 1.0, world_size=1)  # empty means unchanged
    assert "addresses/r0" not in s.ready.writes
    join(s, "r0", 0, 2.0, world_size=1, ftar_addresses=("f:1",), state_addresses=("s:1",))
    assert "addresses/r0" not in s.ready.writes + tuple(s.view.pending_writes())
    t = Driver.restored(SETTINGS, s.view.snapshot_replicas(), [], 3.0, {"r0": s.view.snapshot_addresses("r0")})
    assert t.view.replicas["r0"].ftar_addresses == ("f:1",) and t.view.replicas["r0"].state_addresses == ("s:1",)


def test_new_addresses_or_a_restart_change_the_quorum_id_even_with_the_same_members():
    s = fresh()
    for rid in ("r0", "r1", "r2"):
        join(s, rid, 0, 0.0, world_size=1, ftar_addresses=(f"{rid}:1",), incarnation="a")
    first = s.close_round(0.0).quorum_id
    for rid in ("r0", "r1", "r2"):
        join(s, rid, 1, 1.0, world_size=1, ftar_addresses=(f"{rid}:1",), incarnation="a")
    assert s.close_round(1.0).quorum_id == first  # nothing changed: fast path, same rings
    for rid in ("r0", "r1"):
        join(s, rid, 2, 2.0, world_size=1, incarnation="a")
    join(s, "r2", 2, 2.0, world_size=1, ftar_addresses=("r2:9",), incarnation="a")
    assert s.close_round(2.0).quorum_id == first + 1
    for rid in ("r0", "r1"):
        join(s, rid, 3, 3.0, world_size=1, incarnation="a")
    join(s, "r2", 0, 3.0, world_size=1, incarnation="b")  # restarted, same addresses
    q = s.close_round(3.0)
    assert q.quorum_id == first + 2 and q.member_ids == {"r0", "r1", "r2"}


def test_a_quorum_below_the_committed_step_is_flagged_as_a_rollback():
    s = fresh(replicas=2, min_replicas=1)
    for rid in ("r0", "r1"):
        join(s, rid, 7, 0.0, incarnation="first")
    s.close_round(0.0)
    for rid in ("r0", "r1"):
        commit(s, rid, 1.0)
    for rid in ("r0", "r1"):  # both replicas die and come back as new processes at step 0
        join(s, rid, 0, 2.0, incarnation="again")
    q = s.close_round(2.0)
    assert "ROLLBACK: the job had committed step 7" in q.reason and "resumes at step 0" in q.reason
    assert [e.kind for e in s.view.events].count("rollback") == 1
    assert s.view.max_committed_step == 7


def test_live_replicas_follow_registration_death_rejoin_finish_and_restore():
    """Rounds ask for the live set on every join; it is kept between changes, so check that
    every change shows: a naive recount is the reference."""
    s = fresh()

    def naive():
        return frozenset(r.replica_id for r in s.view.replicas.values()
                         if r.state not in (ReplicaState.DEAD, ReplicaState.FINISHED))

    form(s, {"r0": 0, "r1": 0}, 0.0)
    assert s.view.live_replicas() == naive() == {"r0", "r1"}
    join(s, "r2", 0, 0.5)
    assert s.view.live_replicas() == naive() == {"r0", "r1", "r2"}
    s.report_dead("r1", "NIC down", 1.0)  # the round it looks at closes at once: r1 is not waited for
    q = s.ready.quorum
    assert s.view.live_replicas() == naive() == {"r0", "r2"}
    assert q is not None and q.member_ids == {"r0", "r2"}
    join(s, "r1", 0, 4.0, incarnation="new")
    assert s.view.live_replicas() == naive() == {"r0", "r1", "r2"}
    s.finished("r0", 0, 5.0)
    assert s.view.live_replicas() == naive() == {"r1", "r2"}
    t = Driver.restored(s.settings, *stored(s), 6.0)
    assert t.view.live_replicas() == {"r1", "r2"}


def test_fast_path_answers_are_not_written_down_and_a_successor_still_takes_their_reports():
    s = fresh()
    q = form(s, {"r0": 0, "r1": 0, "r2": 0}, 0.0)
    for rid in ("r0", "r1", "r2"):
        s.report(rid, 0, 1.0, quorum_id=q.quorum_id)
    snapshot = s.view.snapshot_replicas()  # what is durable: committed step 0, given step 0
    again = form(s, {"r0": 1, "r1": 1, "r2": 1}, 2.0)
    assert again.quorum_id == q.quorum_id and again.reason.startswith("fast path")
    # the answers (step 1) follow from what is durable
    assert "replicas" not in s.ready.writes + tuple(s.view.pending_writes())
    # The leader itself still wants exactly what it gave: one step ahead is refused.
    with pytest.raises(FailedPrecondition, match="last quorum answer was quorum .* at step 1"):
        s.report("r0", 2, 3.0, quorum_id=q.quorum_id)
    # A successor loads the snapshot taken before the fast-path round.
    t = Driver.restored(s.settings, snapshot, [s.view.snapshot_hosts(i) for i in range(HOST_SHARDS)], 10.0)
    t.report("r0", 1, 10.0, quorum_id=q.quorum_id)  # the answer it never saw written down
    assert t.view.replicas["r0"].committed_step == 1
    with pytest.raises(FailedPrecondition, match="reported a commit of step 2"):
        t.report("r1", 2, 10.0, quorum_id=q.quorum_id)  # never given: refused
    with pytest.raises(FailedPrecondition, match=f"in quorum {q.quorum_id + 7}"):
        t.report("r2", 1, 10.0, quorum_id=q.quorum_id + 7)  # another quorum: refused
    # Once the successor gives answers itself, the exact rule is back.
    form(t, {"r0": 2, "r1": 1, "r2": 1}, 11.0)
    assert not any(r.given_restored for r in t.view.replicas.values())
