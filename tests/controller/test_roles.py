"""A spare that was given work registers again (after a failover, after it was forgotten):
its role is what the durable record says, never its --spare flag. Fake clock."""

import pytest

from controller.core.errors import FailedPrecondition
from controller.core.model import Assignment, HostState, JoinRequest, ReplicaState
from controller.core.roles import reconcile_spare_claim
from controller.settings import ControllerSettings
from tests.controller.drive import Driver, stored

R0 = Assignment("r0", (0, 1), 2)


def swapped() -> Driver:
    """h0 died; its replica r0 moved onto the spare s0."""
    s = Driver(ControllerSettings(replicas=2, min_replicas=1, heartbeat_timeout_s=10.0))
    s.register("h0", "i0", 0.0, assignment=R0)
    s.register("h1", "i1", 0.0, assignment=Assignment("r1", (0, 1), 2))
    s.register("s0", "is0", 0.0, spare=True)
    for rid, holder in (("r0", "h0"), ("r1", "h1")):
        s.join(JoinRequest(rid, 0, 2, host_id=holder), 0.0)
    s.close_round(0.0)
    s.beat_hosts(["h1", "s0"], 8.0)
    s.beat_replicas(["r0", "r1"], 8.0)
    s.tick(10.5)
    assert s.view.hosts["s0"].assignment == R0 and s.view.hosts["s0"].state == HostState.ACTIVE
    s.take_orders()
    return s


def failed_over(s: Driver, now: float) -> Driver:
    t = Driver.restored(s.settings, *stored(s), now,
              journal=s.view.snapshot_journal())
    return t


def test_a_swapped_spare_that_registers_again_after_a_failover_keeps_its_replica():
    t = failed_over(swapped(), 12.0)
    deaths = dict(t.view.deaths)
    version = t.view.hosts["s0"].assignment_version
    # The agent started with --spare; it now runs r0 and says so.
    assignment, reason = t.register("s0", "is0", 12.5, spare=True, assignment=R0)
    assert assignment == R0 and reason == "already registered"
    s0 = t.view.hosts["s0"]
    assert (s0.state, s0.assignment, s0.assignment_version) == (HostState.ACTIVE, R0, version)
    assert t.take_orders() == [] and t.view.deaths == deaths  # nothing restarted, nobody died
    assert [o.kind for o in t.connect_orders("s0", None)] == ["CURRENT"]
    assert t.connect_orders("s0", None)[0].assignment == R0


def test_a_swapped_spare_with_a_new_incarnation_takes_its_durable_assignment_back():
    s = swapped()
    t = failed_over(s, 12.0)
    t.tick(12.0 + t.settings.takeover_grace_s + 10.5)  # its agent stayed silent: declared dead
    assert t.view.hosts["s0"].state == HostState.DEAD and t.view.hosts["s0"].assignment == R0  # no spare left
    assignment, reason = t.register("s0", "is0-new", 40.0, spare=True, assignment=R0)
    assert assignment == R0 and "returned after repair: replica r0" in reason, reason
    assert t.view.hosts["s0"].state == HostState.ACTIVE


def test_a_spare_whose_work_moved_on_is_a_spare_again_whatever_it_claims():
    s = swapped()
    # The record says s0 runs nothing any more (its work went back to a repaired h0).
    s.register("h0", "i0-new", 11.0)  # h0 back after repair, as a spare
    s.drain("s0", 11.5)
    assert s.view.hosts["h0"].assignment == R0 and s.view.hosts["s0"].assignment is None
    s.uncordon("s0", 11.6)
    t = failed_over(s, 12.0)
    assignment, _ = t.register("s0", "is0", 12.5, spare=True, assignment=R0)
    assert assignment is None and t.view.hosts["s0"].state == HostState.SPARE
    assert t.view.hosts["h0"].assignment == R0  # the holder the record names keeps it


def test_a_spare_claim_the_controller_has_no_record_of_is_a_claim_like_any_other():
    assert reconcile_spare_claim(R0, None) == (R0, False)
    s = swapped()
    with pytest.raises(FailedPrecondition, match="duplicate assignment: host s0 already runs replica r0"):
        s.register("stranger", "x", 12.0, spare=True, assignment=R0)
    assert s.view.replicas["r0"].state != ReplicaState.HEALTHY or s.view.hosts["s0"].assignment == R0
