"""Hosts and spares: the controller core driven by commands (tests/controller/drive.py), on a fake clock."""

import copy

import pytest

from controller.core.errors import FailedPrecondition, InvalidArgument, NotFound, RetryLater
from controller.core.model import Assignment, HostState, JoinRequest, ReplicaState
from controller.core.rendezvous import Endpoints
from controller.core.spares import SpareChoice, pick_spare
from controller.core.host_records import HOST_SHARDS
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored


def a(replica, *ranks, world=2):
    return Assignment(replica, ranks, world)


def cluster(spares=("s0",), spare_zone="z1"):
    s = Driver(ControllerSettings(replicas=2, min_replicas=1, heartbeat_timeout_s=10.0))
    s.register("h0", "i0", 0.0, assignment=a("r0", 0, 1), labels={"zone": "z1"})
    s.register("h1", "i1", 0.0, assignment=a("r1", 0, 1), labels={"zone": "z2"})
    for sp in spares:
        s.register(sp, "i" + sp, 0.0, spare=True, labels={"zone": spare_zone})
    for rid, holder in (("r0", "h0"), ("r1", "h1")):
        s.join(JoinRequest(rid, 0, 2, host_id=holder), 0.0)
    s.close_round(0.0)
    return s


def orders(s):
    return [(o.host_id, o.kind, o.assignment.replica_id if o.assignment else None) for o in s.take_orders()]


def test_agent_silence_swaps_to_spare():
    s = cluster()
    s.beat_hosts(["h1", "s0"], 8.0)
    s.beat_replicas(["r0", "r1"], 8.0)
    s.tick(10.5)
    assert s.view.hosts["h0"].state == HostState.DEAD and s.view.hosts["h0"].cordoned
    assert s.view.replicas["r0"].state == ReplicaState.DEAD and s.view.deaths == {"host": 1}
    assert s.view.hosts["s0"].assignment == a("r0", 0, 1) and s.view.hosts["s0"].state == HostState.ACTIVE
    # The dead host is told to stop too: if its agent still listens, it must not run r0 on.
    assert orders(s) == [("h0", "STOP", None), ("s0", "ASSIGN", "r0")]
    assert s.view.swaps == 1


def test_a_swap_says_why_the_host_it_replaces_failed():
    s = cluster()
    s.beat_hosts(["h1", "s0"], 8.0)
    s.beat_replicas(["r0", "r1"], 8.0)
    s.tick(10.5)
    (swap,) = [e for e in s.view.events if e.kind == "swap"]
    # the journal alone explains it (chaos runs carry it): which spare, why that one, why at all
    assert swap.message.startswith("host s0 takes replica r0 ranks 0,1 from host h0 (spare s0 is ")
    assert swap.message.endswith(f"): {s.view.hosts['h0'].cordon_reason}") and "agent silent" in swap.message


def test_trainer_exit_kills_replica_and_gave_up_cordons_and_swaps():
    s = cluster()
    s.exit("h1", "r1", 1, 1.0, signal=9)
    assert s.view.replicas["r1"].state == ReplicaState.DEAD
    assert "trainer rank 1 on host h1 died (signal 9)" in s.view.replicas["r1"].reason
    # The replica restarts as a unit (here: its one host restarts both its ranks).
    assert not s.view.hosts["h1"].cordoned and orders(s) == [("h1", "RESTART", "r1")]
    s.exit("h1", "r1", 0, 2.0, exit_code=3, stderr_tail="boom\nCUDA error: ECC\n", gave_up=True)
    assert s.view.hosts["h1"].cordoned and "its agent gave up" in s.view.hosts["h1"].cordon_reason
    assert "CUDA error: ECC" in s.view.hosts["h1"].cordon_reason
    assert orders(s) == [("h1", "STOP", None), ("s0", "ASSIGN", "r1")]


def test_no_spare_keeps_replica_out_and_a_new_spare_fills_the_hole():
    s = cluster(spares=())
    s.exit("h0", "r0", 0, 1.0, exit_code=1, gave_up=True)
    assert s.view.hosts["h0"].assignment == a("r0", 0, 1)
    assert any(e.kind == "no_spare" for e in s.view.events)
    assert orders(s) == []
    s.register("s9", "i9", 2.0, spare=True)
    assert s.view.hosts["s9"].assignment == a("r0", 0, 1)
    assert orders(s) == [("h0", "STOP", None), ("s9", "ASSIGN", "r0")]


def test_spare_choice_prefers_same_zone():
    hosts = copy.deepcopy(dict(cluster(spares=("s0", "s1"), spare_zone="z9").view.hosts))  # records to change
    hosts["s1"].labels = {"zone": "z2"}
    choice = pick_spare(hosts["h1"], list(hosts.values()))
    assert choice.host_id == "s1" and "same zone (z2)" in choice.reason
    choice = pick_spare(hosts["h0"], list(hosts.values()))
    assert choice.host_id == "s0" and "no spare in zone z1" in choice.reason


def test_spare_choice_prefers_the_same_block_then_the_same_zone_and_ignores_empty_labels():
    hosts = copy.deepcopy(dict(cluster(spares=("s0", "s1", "s2"), spare_zone="z9").view.hosts))
    hosts["h1"].labels = {"zone": "z2", "block": "b7"}
    hosts["s0"].labels = {"zone": "z2", "block": "b1"}
    hosts["s1"].labels = {"zone": "z3", "block": "b7"}
    hosts["s2"].labels = {"zone": "z2", "block": ""}
    choice = pick_spare(hosts["h1"], list(hosts.values()))
    assert choice == SpareChoice("s1", "spare s1 is in the same block (b7)")
    hosts["s1"].labels = {"zone": "z3", "block": "b8"}  # no spare in b7: the same zone then
    choice = pick_spare(hosts["h1"], list(hosts.values()))
    assert choice == SpareChoice("s0", "spare s0 is in the same zone (z2)")
    hosts["h1"].labels = {"zone": "", "block": ""}  # the downward API's empty values
    assert pick_spare(hosts["h1"], list(hosts.values())) == SpareChoice("s0", "spare s0 is the first free one")
    hosts["h1"].labels = {"zone": "z5", "block": "b5"}
    assert pick_spare(hosts["h1"], list(hosts.values())).reason == (
        "no spare in block b5; spare s0 is the nearest free one")


def test_repaired_host_returns_to_the_pool():
    s = cluster()
    s.tick(10.5)  # everyone silent: h0, h1 and s0 die; s0 can't take over
    s.register("s0", "new-s0", 11.0, spare=True)
    assert s.view.hosts["s0"].state == HostState.ACTIVE  # it took the first orphan
    s.register("h0", "new-h0", 12.0, assignment=a("r0", 0, 1))
    h0 = s.view.hosts["h0"]  # r0 moved to s0, so h0 joins the pool, which fills h1's hole at once
    assert h0.state == HostState.ACTIVE and not h0.cordoned and h0.assignment == a("r1", 0, 1)
    s.register("h1", "new-h1", 13.0, assignment=a("r1", 0, 1))
    h1 = s.view.hosts["h1"]
    assert h1.state == HostState.SPARE and not h1.cordoned and h1.assignment is None


def test_duplicate_registration_and_duplicate_assignment_refused():
    s = cluster()
    before = ([s.view.snapshot_hosts(i) for i in range(HOST_SHARDS)], list(s.orders))
    with pytest.raises(RetryLater, match="host h0 is held by a live agent \\(incarnation i0"):
        s.register("h0", "other", 1.0, assignment=a("r0", 0, 1))
    with pytest.raises(RetryLater, match="Retry later"):  # a secret that is not h0's proves nothing
        s.register("h0", "other", 1.0, assignment=a("r0", 0, 1), previous_secret="not-it")
    with pytest.raises(FailedPrecondition, match="duplicate assignment: host h1 already runs replica r1"):
        s.register("h7", "i7", 1.0, assignment=a("r1", 1, world=2))
    with pytest.raises(InvalidArgument, match="ranks \\[5\\] are outside 0..1"):
        s.register("h8", "i8", 1.0, assignment=a("r1", 5, world=2))
    with pytest.raises(FailedPrecondition, match="duplicate assignment: host h1 already runs replica r1"):
        s.register("h9", "i9", 1.0, spare=True, assignment=a("r1", 0, 1))  # a spare's claim is a claim
    assert ([s.view.snapshot_hosts(i) for i in range(HOST_SHARDS)], list(s.orders)) == before


def test_trainer_exit_for_wrong_replica_refused():
    s = cluster()
    with pytest.raises(FailedPrecondition, match="host h0 does not run replica 'r1' rank 0"):
        s.exit("h0", "r1", 0, 1.0)
    with pytest.raises(NotFound, match="host 'nope' is unknown"):
        s.exit("nope", "r1", 0, 1.0)
    assert s.view.replicas["r1"].state == ReplicaState.HEALTHY


def test_drain_moves_work_then_stops_host():
    s = cluster()
    s.drain("h1", 1.0)
    assert s.view.hosts["h1"].cordoned and s.view.hosts["h1"].cordon_by == "admin"
    assert s.view.hosts["s0"].assignment == a("r1", 0, 1)
    assert orders(s) == [("h1", "STOP", None), ("s0", "ASSIGN", "r1")]
    with pytest.raises(FailedPrecondition, match="cannot drain host h0: no spare"):
        s.drain("h0", 2.0)
    # an admin cordon survives re-registration
    s.register("h1", "again", 20.0)
    assert s.view.hosts["h1"].cordoned


def test_swap_restarts_the_replicas_other_hosts():
    s = Driver(ControllerSettings(replicas=1, heartbeat_timeout_s=10.0))
    s.register("h0", "i0", 0.0, assignment=a("r0", 0))
    s.register("h1", "i1", 0.0, assignment=a("r0", 1))
    s.register("s0", "is", 0.0, spare=True)
    s.beat_hosts(["h1", "s0"], 9.0)
    s.tick(10.5)
    assert orders(s) == [("h0", "STOP", None), ("s0", "ASSIGN", "r0"), ("h1", "RESTART", "r0")]


def test_hosts_survive_a_snapshot_round_trip():
    s = cluster()
    s.drain("h1", 1.0)
    t = Driver.restored(s.settings, *stored(s), 5.0)
    assert {h: (x.state, x.assignment, x.cordoned) for h, x in t.view.hosts.items()} == \
        {h: (x.state, x.assignment, x.cordoned) for h, x in s.view.hosts.items()}
    with pytest.raises(FailedPrecondition, match="duplicate assignment: host s0 already runs replica r1"):
        t.register("h5", "i5", 6.0, assignment=a("r1", 0, 1))


def test_a_dead_host_returning_with_its_old_incarnation_registers_again():
    s = cluster()
    s.tick(10.5)  # everyone silent (e.g. the agents were paused)
    assert s.view.hosts["h0"].state == HostState.DEAD
    assignment, reason = s.register("h0", "i0", 11.0, assignment=a("r0", 0, 1))
    assert s.view.hosts["h0"].state != HostState.DEAD and "returned after repair" in reason


def test_controller_layout_gives_unassigned_agents_free_slots():
    s = Driver(ControllerSettings(replicas=2, hosts_per_replica=2, ranks_per_host=4))
    got = [s.register(f"n{i}", "i", 0.0, address=f"10.0.0.{i}", rendezvous_port=29500,
                            coordinator_port=29501)[0] for i in range(5)]
    assert got[:4] == [a("r0", 0, 1, 2, 3, world=8), a("r0", 4, 5, 6, 7, world=8),
                       a("r1", 0, 1, 2, 3, world=8), a("r1", 4, 5, 6, 7, world=8)]
    assert got[4] is None and s.view.hosts["n4"].state == HostState.SPARE  # layout full: it joins the pool
    # Every rank of a replica meets at its rank-0 host's address: n0 for r0, n2 for r1.
    assert s.view.replica_endpoints("r0") == Endpoints("10.0.0.0:29500", "10.0.0.0:29501")
    assert s.view.replica_endpoints("r1").rendezvous == "10.0.0.2:29500"
    s.register("sp", "i", 0.0, spare=True, address="fd00::7", rendezvous_port=1, coordinator_port=2)
    assert s.view.hosts["sp"].assignment is None  # declared spares stay spares
    # Replicas that span hosts cannot meet at an unknown address: such an agent is refused.
    with pytest.raises(FailedPrecondition, match="host n7 registered no address.*--advertise-address"):
        s.register("n7", "i", 0.0)
    # a node whose agent restarts keeps its slot; a new node takes a freed one
    s.beat_hosts([f"n{i}" for i in (0, 2, 3, 4)] + ["sp"], 9.0)
    s.tick(10.5)  # n1 died: a spare (n4, the lowest id) took its slot
    assert s.view.hosts["n4"].assignment == a("r0", 4, 5, 6, 7, world=8)
    assert s.register("n9", "i", 11.0, address="n9.example", rendezvous_port=7, coordinator_port=8)[0] is None
    assert s.deregister("n9", "i", "SIGTERM", 11.5) == "host n9 left the spare pool"
    s.take_orders()
    # n0 (rank 0 of r0) dies: the spare sp takes it, and r0's ranks meet at sp from now on.
    s.beat_hosts(["n2", "n3", "n4", "sp"], 19.0)
    s.tick(20.6)
    assert s.view.hosts["sp"].assignment == a("r0", 0, 1, 2, 3, world=8)
    assert s.view.replica_endpoints("r0") == Endpoints("[fd00::7]:1", "[fd00::7]:2")
    sent = {o.host_id: o for o in s.take_orders()}
    assert (sent["sp"].kind, sent["n4"].kind) == ("ASSIGN", "RESTART")
    assert sent["n4"].rendezvous_address == sent["sp"].rendezvous_address == "[fd00::7]:1"
    assert sent["n4"].version == sent["sp"].version == s.view.hosts["n4"].assignment_version  # one replica version


def test_layout_settings_are_validated():
    with pytest.raises(ValueError, match="hosts_per_replica must not be negative, got -1"):
        ControllerSettings(hosts_per_replica=-1).validate()
    with pytest.raises(ValueError, match="ranks_per_host must be at least 1, got 0"):
        ControllerSettings(hosts_per_replica=1, ranks_per_host=0).validate()


def test_only_the_host_holding_rank_0_may_lead_its_replica():
    s = cluster()
    s.drain("h0", 1.0)  # r0 moves to s0; a trainer left on h0 must not lead r0 any more
    before = s.view.snapshot_replicas()
    with pytest.raises(FailedPrecondition, match="host h0 does not hold rank 0 of replica r0 \\(host s0 does\\)"):
        s.join(JoinRequest("r0", 1, 2, host_id="h0"), 2.0)
    with pytest.raises(FailedPrecondition, match="host h0 does not hold rank 0 of replica r0"):
        s.report("r0", 0, 2.0, host_id="h0", quorum_id=s.view.quorum.quorum_id)
    assert s.view.snapshot_replicas() == before and "r0" not in s.view.round_joined
    s.join(JoinRequest("r0", 1, 2, host_id="s0"), 3.0)  # the replacement leads
    # no agent holds r9, and the job has its 2 replicas: a third is refused (issue 26), naming them
    with pytest.raises(FailedPrecondition, match=r"replica 'r9' is not one of this job's configured replicas \(r0, r1\)"):
        s.join(JoinRequest("r9", 0, 1, host_id="anywhere"), 3.0)
    assert "r0" in set(s.view.round_joined) and "r9" not in s.view.replicas
