"""Whole-replica restarts, the restart budget, clean agent stops and restarted agents, on a fake clock.

Replica r0 spans two hosts (h0 holds rank 0, h1 rank 1); r1 runs on h2; s0 is a spare."""

import random

import pytest

from controller.core.errors import FailedPrecondition, RetryLater
from controller.core.identity import hash_secret
from controller.core.model import Assignment, HostState, JoinRequest, ReplicaState
from controller.core.restarts import restart_decision
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored


def a(replica, *ranks, world=2):
    return Assignment(replica, ranks, world)


def cluster(spares=("s0",), **settings):
    s = Driver(ControllerSettings(replicas=2, min_replicas=1, heartbeat_timeout_s=10.0,
                                           restart_budget=2, restart_window_s=100.0, **settings))
    for host, assignment in (("h0", a("r0", 0)), ("h1", a("r0", 1)), ("h2", a("r1", 0, world=1))):
        s.register(host, f"{host}-1", 0.0, assignment=assignment, secret_hash=hash_secret(f"{host}-secret"),
                         address=f"10.0.0.{host[1]}", rendezvous_port=29500, coordinator_port=29501)
    for sp in spares:
        s.register(sp, f"{sp}-1", 0.0, spare=True, address="10.0.9.9", rendezvous_port=29500,
                         coordinator_port=29501)
    for rid, holder in (("r0", "h0"), ("r1", "h2")):
        s.join(JoinRequest(rid, 0, 2 if rid == "r0" else 1, host_id=holder), 0.0)
    s.close_round(0.0)
    s.take_orders()
    return s


def orders(s):
    return [(o.host_id, o.kind) for o in s.take_orders()]


def version(s, host):
    return s.view.hosts[host].assignment_version


@pytest.mark.parametrize("times, now, replace, words", [
    ([], 0.0, False, "replica restart 1 of 2 allowed per 100 s"),
    ([5.0], 50.0, False, "replica restart 2 of 2"),
    ([5.0, 40.0], 50.0, True, "restart budget exhausted: 2 replica restart(s) in the last 100 s, budget 2"),
    ([5.0, 40.0], 105.5, False, "replica restart 2 of 2"),  # the first left the window
    ([50.0], 50.0, False, "replica restart 2 of 2"),  # a restart at this very moment counts
])
def test_restart_decision_table(times, now, replace, words):
    d = restart_decision(times, now, budget=2, window_s=100.0)
    assert d.replace_host is replace and words in d.reason


def test_restart_decision_matches_a_naive_count():
    rng = random.Random(14)
    for _ in range(300):
        times = sorted(rng.uniform(0, 100) for _ in range(rng.randint(0, 6)))
        now, window, budget = rng.uniform(0, 150), rng.choice([1.0, 30.0, 1000.0]), rng.randint(0, 4)
        naive = len([t for t in times if now - window < t <= now])
        assert restart_decision(times, now, budget, window).replace_host is (naive >= budget)


def test_a_dead_rank_restarts_every_host_of_its_replica_under_one_new_version():
    s = cluster()
    before = version(s, "h0"), version(s, "h1")
    s.exit("h1", "r0", 1, 1.0, signal=9, version=version(s, "h1"))
    sent = s.take_orders()
    assert [(o.host_id, o.kind) for o in sent] == [("h0", "RESTART"), ("h1", "RESTART")]
    new = version(s, "h0")
    assert new == version(s, "h1") == s.view.replica_versions["r0"] > max(before)
    assert all(o.version == new and o.assignment.replica_id == "r0" for o in sent)
    # Each rank learns where its replica meets: rank 0's host, never loopback.
    assert {(o.rendezvous_address, o.coordinator_address) for o in sent} == {("10.0.0.0:29500", "10.0.0.0:29501")}
    assert s.view.replicas["r0"].state == ReplicaState.DEAD and s.view.replicas["r0"].restarts == 1
    assert s.view.replicas["r1"].state == ReplicaState.HEALTHY and version(s, "h2") not in (new,)
    [event] = [e for e in s.view.events if e.kind == "replica_restart"]
    assert "replica r0 restarts its ranks on 2 host(s) together: trainer rank 1 on host h1 died (signal 9)" in event.message

    # The survivor on h0 crashed before its RESTART arrived: its exit is of the old version, nothing happens.
    s.exit("h0", "r0", 0, 1.1, signal=6, version=before[0])
    assert orders(s) == [] and s.view.replicas["r0"].restarts == 1
    assert "started under version" in s.view.events[-1].message and "nothing to do" in s.view.events[-1].message
    # A death of the restarted trainers counts again.
    s.exit("h0", "r0", 0, 2.0, exit_code=1, version=new)
    assert orders(s) == [("h0", "RESTART"), ("h1", "RESTART")] and s.view.replicas["r0"].restarts == 2


def test_the_budget_counts_replica_restarts_per_host_then_the_host_is_replaced():
    s = cluster()
    for t in (1.0, 2.0):  # budget 2 per 100 s
        s.exit("h1", "r0", 1, t, signal=9, version=version(s, "h1"))
        assert orders(s) == [("h0", "RESTART"), ("h1", "RESTART")]
    s.exit("h1", "r0", 1, 3.0, signal=9, version=version(s, "h1"))
    h1, s0 = s.view.hosts["h1"], s.view.hosts["s0"]
    assert h1.cordoned and h1.cordon_reason.startswith("restart budget exhausted: 2 replica restart(s)")
    assert h1.assignment is None and s0.assignment == a("r0", 1)
    sent = s.take_orders()
    assert [(o.host_id, o.kind) for o in sent] == [("h1", "STOP"), ("s0", "ASSIGN"), ("h0", "RESTART")]
    assert sent[1].version == sent[2].version == s.view.replica_versions["r0"]  # one replica version
    assert s.view.replicas["r0"].restarts == 2 and s.view.swaps == 1
    # h0's own deaths have their own budget, and the window moves on the clock.
    for t in (4.0, 5.0, 200.0, 201.0):
        s.exit("h0", "r0", 0, t, signal=9, version=version(s, "h0"))
        assert orders(s) == [("h0", "RESTART"), ("s0", "RESTART")], t


def test_a_new_leader_counts_on_the_restarts_its_predecessor_allowed():
    """A crash loop must not earn a fresh budget from every controller failover: the restart
    times are part of the host's durable record. The window still moves on the clock."""
    s = cluster()
    for t in (1.0, 2.0):  # the whole budget (2 per 100 s) spent under the first leader
        s.exit("h1", "r0", 1, t, signal=9, version=version(s, "h1"))
        assert orders(s) == [("h0", "RESTART"), ("h1", "RESTART")]
    t = Driver.restored(s.settings, *stored(s), 3.0)
    assert t.view.hosts["h1"].restart_times_s == [1.0, 2.0]
    t.exit("h1", "r0", 1, 4.0, signal=9, version=version(t, "h1"))
    h1 = t.view.hosts["h1"]
    assert h1.cordoned and h1.cordon_reason.startswith("restart budget exhausted: 2 replica restart(s)")
    # h0's record: no restart charged to it; 150 s on, h1's old restarts have left the window
    u = Driver.restored(s.settings, *stored(s), 150.0)
    assert u.view.hosts["h0"].restart_times_s == []
    u.exit("h1", "r0", 1, 150.0, signal=9, version=version(u, "h1"))
    assert orders(u) == [("h0", "RESTART"), ("h1", "RESTART")]
    assert u.view.hosts["h1"].restart_times_s == [150.0]  # only the times inside the window are kept


def test_without_a_spare_the_replica_is_down_until_one_comes():
    s = cluster(spares=())
    s.exit("h1", "r0", 1, 1.0, exit_code=3, version=version(s, "h1"))
    s.exit("h1", "r0", 1, 2.0, exit_code=3, version=version(s, "h1"))
    s.take_orders()
    s.exit("h1", "r0", 1, 3.0, exit_code=3, version=version(s, "h1"))
    # Budget spent and no spare: h1 keeps its work, cordoned; h0 stops (its peer is gone).
    assert s.view.hosts["h1"].cordoned and s.view.hosts["h1"].assignment == a("r0", 1)
    assert orders(s) == [("h0", "STOP")]
    assert any(e.kind == "no_spare" for e in s.view.events)
    s.register("s7", "s7-1", 4.0, spare=True, address="10.0.7.7", rendezvous_port=1, coordinator_port=2)
    assert orders(s) == [("h1", "STOP"), ("s7", "ASSIGN"), ("h0", "RESTART")]


def test_a_clean_stop_deregisters_moves_the_work_and_lets_the_agent_back_at_once():
    s = cluster()
    with pytest.raises(FailedPrecondition, match="registered by incarnation 'h1-1', not 'h1-0'"):
        s.deregister("h1", "h1-0", "SIGTERM", 1.0)
    assert s.view.hosts["h1"].state == HostState.ACTIVE and orders(s) == []
    s.deregister("h1", "h1-1", "SIGTERM (pod deleted)", 1.0)
    h1 = s.view.hosts["h1"]
    assert h1.state == HostState.DEAD and not h1.cordoned and h1.assignment is None
    assert s.view.replicas["r0"].state == ReplicaState.DEAD
    assert s.view.replicas["r0"].reason == "host h1 left: its agent stopped: SIGTERM (pod deleted)"
    assert orders(s) == [("h1", "STOP"), ("s0", "ASSIGN"), ("h0", "RESTART")]
    assert [e.kind for e in s.view.events if e.kind in ("host_left", "death", "swap")] == ["host_left", "death", "swap"]
    # The same host's next agent registers at once (no "already registered by a live agent").
    assignment, reason = s.register("h1", "h1-2", 1.5, address="10.0.0.1", rendezvous_port=29500,
                                          coordinator_port=29501)
    assert assignment is None and s.view.hosts["h1"].state == HostState.SPARE and "registered again" in reason


def test_a_clean_stop_without_a_spare_marks_the_replica_down_and_its_return_restarts_it():
    s = cluster(spares=())
    s.deregister("h0", "h0-1", "node drain", 1.0)
    assert s.view.replicas["r0"].state == ReplicaState.DEAD and "host h0 left" in s.view.replicas["r0"].reason
    assert s.view.hosts["h0"].assignment == a("r0", 0)  # kept: nothing can take it
    assert orders(s) == [("h1", "STOP")]
    old = version(s, "h1")
    assignment, _ = s.register("h0", "h0-2", 2.0, address="10.0.0.0", rendezvous_port=29500,
                                     coordinator_port=29501)
    assert assignment == a("r0", 0) and s.view.hosts["h0"].state == HostState.ACTIVE
    assert orders(s) == [("h1", "RESTART")] and version(s, "h1") == version(s, "h0") > old


def test_a_restarted_agent_takes_its_host_over_with_its_predecessors_secret():
    s = cluster()
    s.beat_hosts(["h0", "h1", "h2", "s0"], 5.0)
    with pytest.raises(RetryLater, match=r"held by a live agent .* \(10.0s more of silence\)"):
        s.register("h1", "h1-2", 5.0, assignment=a("r0", 1))
    assert orders(s) == [] and s.view.hosts["h1"].incarnation == "h1-1"
    assignment, reason = s.register("h1", "h1-2", 5.0, assignment=a("r0", 1), previous_secret="h1-secret",
                                          secret_hash=hash_secret("h1-new"), address="10.0.0.1",
                                          rendezvous_port=29500, coordinator_port=29501)
    assert assignment == a("r0", 1) and "taken over by a restarted agent" in reason
    h1 = s.view.hosts["h1"]
    assert h1.incarnation == "h1-2" and h1.secret_hash == hash_secret("h1-new") and h1.state == HostState.ACTIVE
    # Its old trainers died with the old agent: the replica restarts around it, no swap.
    assert orders(s) == [("h0", "RESTART")] and s.view.swaps == 0 and version(s, "h0") == version(s, "h1")
    # Without the secret a second agent waits until the first is declared dead; then it is a host death.
    s.beat_hosts(["h0", "h2", "s0"], 14.0)
    s.tick(15.5)
    assert s.view.hosts["h1"].state == HostState.DEAD and s.view.hosts["s0"].assignment == a("r0", 1)
    assignment, reason = s.register("h1", "h1-3", 16.0, address="10.0.0.1", rendezvous_port=29500,
                                          coordinator_port=29501)
    assert assignment is None and "returned after repair" in reason


def test_registration_bounds_on_addresses_and_secrets_change_nothing():
    s = cluster()
    before = (s.view.snapshot_host_shards(range(64)), list(s.orders))
    for kw, words in [
        (dict(address="10.0.0.5:80", rendezvous_port=1, coordinator_port=2), "without a port"),
        (dict(address="a b", rendezvous_port=1, coordinator_port=2), "printable ASCII without spaces"),
        (dict(address="x" * 300, rendezvous_port=1, coordinator_port=2), "must be 1..256 characters"),
        (dict(address="h", rendezvous_port=0, coordinator_port=2), "rendezvous_port must be 1..65535, got 0"),
        (dict(address="h", rendezvous_port=5, coordinator_port=70000), "coordinator_port must be 1..65535"),
        (dict(address="h", rendezvous_port=5, coordinator_port=5), "must differ, both are 5"),
        (dict(previous_secret="s" * 129), "previous_secret is 129 characters"),
    ]:
        with pytest.raises(Exception, match=words):
            s.register("h9", "h9-1", 1.0, spare=True, **kw)
    assert (s.view.snapshot_host_shards(range(64)), list(s.orders)) == before and "h9" not in s.view.hosts


def test_exit_of_a_trainer_from_before_a_swap_is_recorded_not_refused():
    s = cluster()
    old = version(s, "h1")
    s.drain("h1", 1.0)  # r0 rank 1 moves to s0
    s.take_orders()
    s.exit("h1", "r0", 1, 1.5, signal=15, version=old)  # h1's trainer, stopped by the drain
    assert orders(s) == [] and s.view.replicas["r0"].restarts == 0
    with pytest.raises(FailedPrecondition, match="host h1 does not run replica 'r0' rank 1"):
        s.exit("h1", "r0", 1, 1.5, signal=15)  # unversioned: it must be what the host runs


def test_leaving_the_round_and_the_reason_that_names_who_is_missing():
    s = Driver(ControllerSettings(replicas=4, min_replicas=2, heartbeat_timeout_s=10.0))
    for rid in ("r0", "r1", "r2"):
        s.join(JoinRequest(rid, 0, 1), 0.0)
    s.report_dead("r2", "trainer died", 0.5)
    assert s.leave("r1", "its leader's Quorum call ended", 0.6) and not s.leave("r1", "again", 0.6)
    assert s.close_round(0.7) is None
    assert s.view.round_reason == ("waiting: 1 joined (r0), min_replicas is 2; missing r1, r2 (dead), "
                              "1 not registered yet")
    assert "r1" not in s.view.round_joined and s.view.replicas["r1"].state == ReplicaState.JOINING


def test_a_deregistration_reason_is_cut_with_a_marker():
    s = cluster()
    s.deregister("h2", "h2-1", "why " * 2000, 1.0)
    reason = s.view.replicas["r1"].reason
    assert "more characters cut]" in reason and len(reason) <= s.settings.max_reason_chars
