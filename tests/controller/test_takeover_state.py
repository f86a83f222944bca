"""After a takeover, on a fake clock: the silence grace, and assignment versions that never go
back, orders that know when they are stale, the current assignment on (re)connect."""

import pytest

from controller.core.host_records import HOST_SHARDS
from controller.core.model import Assignment, HostState, JoinRequest, ReplicaState
from controller.core.hosts import VERSION_BLOCK
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored

HB = 3.0  # the demo's heartbeat timeout
SETTINGS = ControllerSettings(replicas=3, min_replicas=1, heartbeat_timeout_s=HB)


def a(replica, *ranks, world=1):
    return Assignment(replica, ranks, world)


def running_job(now=0.0):
    s = Driver(SETTINGS)
    for i, rid in enumerate(("r0", "r1", "r2")):
        s.register(f"h{i}", f"i{i}", now, assignment=a(rid, 0))
        s.join(JoinRequest(rid, 0, 1, host_id=f"h{i}"), now)
    s.register("spare0", "is", now, spare=True)
    s.close_round(now)  # the spare's registration looked at the round already: it formed then
    assert s.view.quorum is not None
    return s


def take_over(s, now):
    """What a new leader does: load the last snapshot, then forgive silence."""
    t = Driver.restored(s.settings, *stored(s), now)
    t.takeover("b", t.settings.takeover_grace_s, now)
    return t


def dead(s):
    return sorted([h.host_id for h in s.view.hosts.values() if h.state == HostState.DEAD]
                  + [r.replica_id for r in s.view.replicas.values() if r.state == ReplicaState.DEAD])


def test_the_grace_is_a_reconnect_cycle_after_a_frozen_leader_is_given_up():
    s = SETTINGS.validate()
    assert s.reconnect_cycle_s == s.client_backoff_cap_s + s.client_call_s == 2.0
    assert s.takeover_grace_s == s.client_timeout_s + s.reconnect_cycle_s == 7.0


def test_nobody_is_declared_dead_for_silence_during_the_takeover_grace():
    s = running_job()
    t = take_over(s, 100.0)  # the old leader died long ago: that silence is forgiven
    grace = t.settings.takeover_grace_s
    t.tick(100.0 + HB + 0.5)  # the old rule's deadline: everybody would have died here
    assert dead(t) == [] and t.view.swaps == 0 and t.take_orders() == []
    # Agents and leaders reconnect within the grace and beat as usual: still nobody dies.
    t.beat_hosts(["h0", "h1", "spare0"], 100.0 + grace - 1)
    t.beat_replicas(["r0", "r1"], 100.0 + grace - 1)
    t.tick(100.0 + grace + HB - 0.01)
    assert dead(t) == []
    # Whoever never came back counts as silent from the end of the grace, then dies.
    t.beat_hosts(["h0", "h1", "spare0"], 100.0 + grace + 1)
    t.beat_replicas(["r0", "r1"], 100.0 + grace + 1)
    t.tick(100.0 + grace + HB + 0.01)
    assert dead(t) == ["h2", "r2"]
    host_death = next(e for e in t.view.events if e.kind == "host_death")
    assert "counted from the end of a takeover grace" in host_death.message
    assert any(e.kind == "grace" and "took over" in e.message for e in t.view.events)


def test_a_heartbeat_timeout_that_cannot_cover_a_reconnect_cycle_is_refused():
    with pytest.raises(ValueError) as err:
        ControllerSettings(heartbeat_timeout_s=1.5).validate()
    assert ("heartbeat_timeout_s (1.5 s) must be at least client_backoff_cap_s (1 s) + client_call_s (1 s) = 2 s: "
            "a live client that lost its connection reconnects") in str(err.value)
    ControllerSettings(heartbeat_timeout_s=1.5, client_backoff_cap_s=0.5).validate()  # a faster client cap
    with pytest.raises(ValueError, match="rollback_wait_s must not be negative, got -1"):
        ControllerSettings(rollback_wait_s=-1).validate()
    with pytest.raises(ValueError, match="client_timeout_s must be a positive number of seconds, got 0"):
        ControllerSettings(client_timeout_s=0).validate()


def test_versions_never_go_back_across_a_takeover_even_unpersisted_ones():
    s = running_job()
    hosts_before = [s.view.snapshot_hosts(i) for i in range(HOST_SHARDS)]
    s.register("h9", "i9", 1.0)  # a spare's registration: its shard is written behind
    s.drain("h0", 1.0)  # and this decision's version went out with an order
    given = max(h.assignment_version for h in s.view.hosts.values())
    t = Driver.restored(s.settings, s.view.snapshot_replicas(), hosts_before, 2.0)  # the host shards never got written
    t.drain("h1", 3.0)  # the new leader's decisions: versions above every one given before
    assert t.view.hosts["h1"].assignment_version > given and t.view.hosts["spare0"].assignment_version > given
    assert t.view.version_ceiling >= t.view.assignment_seq and s.view.version_ceiling == VERSION_BLOCK + 1


def test_the_issue_sequence_a_stale_assign_is_never_replayed():
    """r2 moved h2 -> spare0 while spare0 was cut off, then spare0 -> h2; when spare0 comes back
    it is told it runs nothing, and the next swap onto it is accepted."""
    s = running_job()
    pending = {}  # what the service keeps for hosts without an open stream: the newest order

    def deliver():
        for order in s.take_orders():
            pending[order.host_id] = order
    # h2 falls silent: r2 moves to spare0 (which is cut off too: its ASSIGN waits).
    s.beat_hosts(["h0", "h1"], 2.5)
    s.beat_replicas(["r0", "r1"], 2.5)
    s.beat_hosts(["spare0"], 2.0)
    s.tick(3.5)
    assert s.view.hosts["spare0"].assignment == a("r2", 0)
    deliver()
    stale_assign = pending["spare0"]
    assert stale_assign.kind == "ASSIGN" and stale_assign.version == s.view.hosts["spare0"].assignment_version
    # h2's agent comes back (its work moved: it joins the pool); spare0 is declared dead.
    s.register("h2", "i2-new", 4.0, assignment=a("r2", 0))
    for t in (4.0, 5.0, 5.5):
        s.beat_hosts(["h0", "h1", "h2"], t)
    s.tick(5.5)
    assert s.view.hosts["spare0"].state == HostState.DEAD and s.view.hosts["h2"].assignment == a("r2", 0)
    deliver()
    assert pending["spare0"].kind == "STOP" and s.view.is_superseded(stale_assign)
    # spare0 reconnects: told its current assignment (none), nothing replayed.
    assignment, _ = s.register("spare0", "is-2", 6.0, spare=True)
    assert assignment is None
    [current] = s.connect_orders("spare0", pending.pop("spare0"))
    assert current.kind == "CURRENT" and current.assignment is None
    assert current.version == s.view.hosts["spare0"].assignment_version > stale_assign.version
    # The next swap onto spare0 goes through.
    s.beat_hosts(["h1", "h2", "spare0"], 9.0)
    s.beat_replicas(["r1", "r2"], 9.0)
    s.tick(9.0)
    assert s.view.hosts["spare0"].assignment == a("r0", 0)
    orders = s.take_orders()
    assert [(o.host_id, o.kind) for o in orders] == [("h0", "STOP"), ("spare0", "ASSIGN")]
    assert orders[1].replica_version == s.view.replica_versions["r0"] == orders[1].version


def test_a_pending_restart_still_stands_unless_superseded():
    s = Driver(ControllerSettings(replicas=1, heartbeat_timeout_s=10.0))
    s.register("h0", "i0", 0.0, assignment=a("r0", 0, world=2))
    s.register("h1", "i1", 0.0, assignment=a("r0", 1, world=2))
    s.register("s0", "is", 0.0, spare=True)
    s.beat_hosts(["h1", "s0"], 9.0)
    s.tick(10.5)
    s.register("s1", "is1", 10.5, spare=True)
    restart = next(o for o in s.take_orders() if o.kind == "RESTART")
    assert [o.kind for o in s.connect_orders("h1", restart)] == ["CURRENT", "RESTART"]
    s.drain("h1", 11.0)  # too late: h1's assignment changed since
    assert [o.kind for o in s.connect_orders("h1", restart)] == ["CURRENT"]


def test_current_orders_get_ids_that_a_new_leader_never_repeats():
    s = running_job()
    first = s.connect_orders("h0", None)[0]
    t = take_over(s, 50.0)
    assert int(t.connect_orders("h0", None)[0].order_id[1:]) > int(first.order_id[1:])


def test_the_durable_quorum_record_holds_every_field_and_reads_back_equal():
    import json
    from dataclasses import asdict, fields

    from controller.core.model import Member, Quorum
    from controller.core.quorum_codec import quorum_from_dict as _quorum_from_dict, quorum_to_dict as _quorum_to_dict

    q = Quorum(quorum_id=7, members=(Member("r0", 4, True), Member("r1", 2, False)), max_step=4,
               recover={"r1": ("r0",)}, lr_scale=0.5, reason="r1 behind", formed_at=12.5, resume_checkpoint_step=3)
    record = _quorum_to_dict(q)
    # written out by hand for speed: a field added to Quorum must be added there too
    assert list(record) == [f.name for f in fields(Quorum)]
    assert json.dumps(record) == json.dumps(dict(asdict(q), recover={"r1": ["r0"]}))  # the same bytes
    assert _quorum_from_dict(record) == q


def test_a_replicas_section_written_before_the_coordinator_address_was_named_so_reads_back():
    """The replica's coordinator address was once stored as `leader_address`: a snapshot a
    controller of that time wrote still restores, with the address kept."""
    s = running_job()
    old = s.view.snapshot_replicas()
    for d in old["replicas"]:
        d["leader_address"] = d.pop("coordinator_address")
        if d["replica_id"] == "r1":
            d["leader_address"] = "10.0.0.1:29500"
    t = Driver.restored(SETTINGS, old, [s.view.snapshot_hosts(i) for i in range(HOST_SHARDS)], 1.0)
    assert t.view.replicas["r1"].coordinator_address == "10.0.0.1:29500" and t.view.replicas["r0"].coordinator_address == ""
