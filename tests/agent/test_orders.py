"""Table tests for which orders an agent accepts, and for settings validation."""

from __future__ import annotations

import pytest

from agent.orders import Assignment, Effect, meet_locally, plan_order, wants_for
from agent.policy import Role
from agent.settings import AgentSettings, substitute
from protos import controller_pb2 as pb

R0 = Assignment("r0", (0, 1), 2)
R1 = Assignment("r1", (0, 1), 2)
O = pb.Order

CASES = [
    # (name, kind, proposed, current, assignment after, effect, words in the error)
    ("spare takes an assignment", O.ASSIGN, R0, None, R0, Effect.TRAIN, ""),
    ("same assignment again", O.ASSIGN, R0, R0, R0, Effect.TRAIN, ""),
    ("duplicate assignment", O.ASSIGN, R1, R0, R0, None, "duplicate assignment of replica 'r1'"),
    ("assign without replica", O.ASSIGN, Assignment("", (0,), 1), None, None, None, "no replica_id"),
    ("assign empty", O.ASSIGN, None, None, None, None, "no replica_id"),
    ("assign rank out of range", O.ASSIGN, Assignment("r0", (0, 5), 2), None, None, None,
     "ranks [5]"),
    ("assign repeated ranks", O.ASSIGN, Assignment("r0", (1, 1), 2), None, None, None, "repeat"),
    ("assign bad world size", O.ASSIGN, Assignment("r0", (0,), 0), None, None, None,
     "world_size must be >= 1, got 0"),
    ("assign more ranks than slots", O.ASSIGN, Assignment("r0", (0, 1, 2), 4), None, None, None,
     "do not fit in 2 slots"),
    ("restart own replica", O.RESTART, None, R0, R0, Effect.RESTART, ""),
    ("restart naming own replica", O.RESTART, Assignment("r0", (1,), 2), R0, R0, Effect.RESTART,
     ""),
    ("restart unknown replica", O.RESTART, Assignment("r9", (0,), 2), R0, R0, None,
     "unknown replica 'r9'"),
    ("restart on a spare", O.RESTART, None, None, None, None, "has no assignment"),
    ("start own replica", O.START, None, R0, R0, Effect.TRAIN, ""),
    ("start unknown replica", O.START, R1, R0, R0, None, "unknown replica 'r1'"),
    ("stop: work moved away", O.STOP, None, R0, None, Effect.STOP, ""),
    ("stop own replica", O.STOP, Assignment("r0", (0, 1), 2), R0, R0, Effect.STOP, ""),
    ("stop unknown replica", O.STOP, R1, R0, R0, None, "unknown replica 'r1'"),
    ("release", O.RELEASE, None, R0, None, Effect.RELEASE, ""),
    ("unspecified kind", O.KIND_UNSPECIFIED, None, R0, R0, None, "unknown order kind"),
    ("unknown kind number", 42, None, R0, R0, None, "unknown order kind 42"),
]


VERSION_CASES = [
    # (name, kind, proposed, current, order version, host version, after, effect, version after, error words)
    ("stale assign refused", O.ASSIGN, R1, None, 3, 5, None, None, 5,
     "ASSIGN refused: its assignment version 3 is older than version 5, which host h1 runs"),
    ("stale stop refused", O.STOP, None, R0, 4, 5, R0, None, 5, "older than version 5"),
    ("stale restart refused", O.RESTART, None, R0, 4, 5, R0, None, 5, "version 4 is older"),
    ("restart at the host's version", O.RESTART, None, R0, 5, 5, R0, Effect.RESTART, 5, ""),
    ("newer assign replaces another replica", O.ASSIGN, R1, R0, 6, 5, R1, Effect.TRAIN, 6, ""),
    ("same-version assign of another replica is a duplicate", O.ASSIGN, R1, R0, 5, 5, R0, None, 5,
     "duplicate assignment"),
    ("unversioned order is not refused for age", O.STOP, None, R0, 0, 5, None, Effect.STOP, 5, ""),
    ("current: what it runs", O.CURRENT, R0, R0, 5, 5, R0, Effect.KEEP, 5, ""),
    ("current: nothing any more", O.CURRENT, None, R0, 7, 5, None, Effect.RELEASE, 7, ""),
    ("current: another replica", O.CURRENT, R1, R0, 7, 5, R1, Effect.TRAIN, 7, ""),
    ("current: stale", O.CURRENT, None, R0, 4, 5, R0, None, 5, "CURRENT refused: its assignment version 4"),
    ("current: bad assignment", O.CURRENT, Assignment("r0", (0, 9), 2), None, 7, 5, None, None, 5,
     "ranks [9]"),
]


@pytest.mark.parametrize("name,kind,proposed,current,version,mine,after,effect,after_version,words",
                         VERSION_CASES, ids=[c[0] for c in VERSION_CASES])
def test_orders_older_than_what_the_host_runs_are_refused(name, kind, proposed, current, version, mine,
                                                          after, effect, after_version, words):
    plan = plan_order(kind, proposed, current, slots=2, host_id="h1", version=version, current_version=mine)
    assert (plan.assignment, plan.effect, plan.version) == (after, effect, after_version)
    assert (words in plan.error) if words else plan.error == ""


@pytest.mark.parametrize("name,kind,proposed,current,after,effect,words", CASES,
                         ids=[c[0] for c in CASES])
def test_plan_order(name, kind, proposed, current, after, effect, words):
    plan = plan_order(kind, proposed, current, slots=2, host_id="h1")
    assert (plan.assignment, plan.effect) == (after, effect)
    assert (words in plan.error) if words else plan.error == ""


def test_wants_follow_the_plan():
    wants = wants_for(R0, Effect.TRAIN, 2, standby=False, version=5)
    assert [(w.placement.rank, w.placement.local_rank, w.placement.local_world_size, w.version)
            for w in wants] == [(0, 0, 2, 5), (1, 1, 2, 5)]
    assert {w.role for w in wants_for(R0, Effect.STOP, 2, standby=True)} == {Role.IDLE}
    assert {w.role for w in wants_for(None, Effect.RELEASE, 2, standby=True)} == {Role.STANDBY}
    assert {w.role for w in wants_for(None, Effect.RELEASE, 2, standby=False)} == {Role.IDLE}


def test_assignment_round_trips_through_the_wire():
    assert Assignment.from_proto(R0.to_proto()) == R0
    assert Assignment.from_proto(pb.Assignment()) is None
    told = Assignment.from_proto(pb.Assignment(replica_id="r0", ranks=[1], world_size=2,
                                               rendezvous_address="10.0.0.3:29500", coordinator_address="10.0.0.3:1"))
    assert (told.rendezvous, told.coordinator) == ("10.0.0.3:29500", "10.0.0.3:1")
    assert told.same_work(Assignment("r0", (1,), 2)) and not told.same_work(Assignment("r0", (0,), 2))


def test_a_restart_carries_where_the_replica_meets_now():
    current = Assignment("r0", (1,), 2, "10.0.0.1:29500", "10.0.0.1:29501")
    moved = Assignment("r0", (0, 1), 2, "10.0.0.9:29500", "10.0.0.9:29501")
    plan = plan_order(O.RESTART, moved, current, 1, "h1", version=9, current_version=3)
    assert plan.assignment == Assignment("r0", (1,), 2, "10.0.0.9:29500", "10.0.0.9:29501")
    assert (plan.effect, plan.version) == (Effect.RESTART, 9)
    # A CURRENT that says the replica meets elsewhere is a new placement (its trainers restart).
    plan = plan_order(O.CURRENT, Assignment("r0", (1,), 2, "10.0.0.9:29500", "10.0.0.9:29501"), current, 1, "h1")
    assert plan.effect is Effect.TRAIN


def test_a_replica_on_one_host_meets_on_loopback_unless_told_otherwise():
    assert meet_locally(Assignment("r0", (0, 1), 2), 25000, 25001) == Assignment(
        "r0", (0, 1), 2, "127.0.0.1:25000", "127.0.0.1:25001")
    told = Assignment("r0", (0, 1), 2, "10.0.0.1:29500", "10.0.0.1:29501")
    assert meet_locally(told, 25000, 25001) == told
    assert meet_locally(Assignment("r0", (0,), 2), 25000, 25001) == Assignment("r0", (0,), 2)  # spans hosts
    assert meet_locally(None, 1, 2) is None


def settings(**kw):
    base = dict(controller_addresses=("127.0.0.1:1",), host_id="h1", command=("t",),
                replica_id="r0", ranks=(0,), world_size=1)
    base.update(kw)
    return AgentSettings(**base)


@pytest.mark.parametrize("kw,words", [
    ({"controller_addresses": ()}, "controller address"),
    ({"host_id": ""}, "host id"),
    ({"command": ()}, "command template"),
    ({"spare": True}, "replica_id='r0'"),
    ({"ranks": (0, 3), "world_size": 2, "slots": 2}, "Ranks [3]"),
    ({"ranks": (0, 1), "world_size": 2, "slots": 1}, "2 ranks do not fit in 1 slots"),
    ({"restart_budget": -1}, "restart_budget must be >= 0, got -1"),
    ({"restart_window_s": 0}, "restart_window_s must be > 0, got 0"),
    ({"spare": True, "replica_id": "", "standby": True, "command": ("t", "{rank}")},
     "cannot use ['rank']"),
    ({"advertise_address": "10.0.0.1:29500"}, "without a port, got '10.0.0.1:29500'"),
    ({"advertise_address": "a b"}, "without a port, got 'a b'"),
    ({"rendezvous_port": 70000}, "rendezvous_port must be 0..65535 (0: pick a free one), got 70000"),
    ({"rendezvous_port": 5, "coordinator_port": 5}, "must differ, both are 5"),
])
def test_validate_names_the_bad_value(kw, words):
    with pytest.raises(ValueError) as err:
        settings(**kw).validate()
    assert words in str(err.value)


def test_substitute_replaces_only_known_placeholders():
    argv = substitute(("x", "--r={replica_id}/{rank}", "{'a': {world_size}}", "{other}"),
                      {"replica_id": "r0", "rank": 1, "world_size": 2})
    assert argv == ["x", "--r=r0/1", "{'a': 2}", "{other}"]
