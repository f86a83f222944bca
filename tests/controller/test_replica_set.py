"""Joins outside the configured replicas, or with another rank count, are refused (issue 26)."""

import copy

import pytest

from controller.core.errors import FailedPrecondition
from controller.core.model import Assignment, JoinRequest
from controller.settings import ControllerSettings
from tests.controller.drive import Driver


def two_replicas_of_two_ranks():
    s = Driver(ControllerSettings(replicas=2, min_replicas=1))
    for i in range(2):
        s.register(f"h{i}", f"i{i}", 0.0, assignment=Assignment(f"r{i}", (0, 1), 2))
    return s


def test_a_third_replica_of_two_is_refused_naming_the_configured_ones():
    s = two_replicas_of_two_ranks()
    before = copy.deepcopy(s.view.snapshot_replicas())
    with pytest.raises(FailedPrecondition, match=r"replica '0' is not one of this job's configured replicas "
                                                 r"\(r0, r1\): no host holds it.*standby must wait"):
        s.join(JoinRequest("0", 0, 1), 1.0)
    assert s.view.snapshot_replicas() == before and not s.view.round_joined


def test_a_held_replica_with_another_rank_count_is_refused():
    s = two_replicas_of_two_ranks()
    with pytest.raises(FailedPrecondition, match="replica r0 joined with 1 rank\\(s\\), but it is configured with 2"):
        s.join(JoinRequest("r0", 0, 1, host_id="h0"), 1.0)
    s.join(JoinRequest("r0", 0, 2, host_id="h0"), 1.0)
    assert "r0" in s.view.round_joined


def test_without_agents_replicas_join_freely_and_room_is_left_for_one_without_agents():
    s = Driver(ControllerSettings(replicas=2, min_replicas=1))
    for rid in ("a", "b", "c"):  # torchrun-only: nothing to check against
        s.join(JoinRequest(rid, 0, 1), 1.0)
    t = Driver(ControllerSettings(replicas=2, min_replicas=1))
    t.register("h0", "i0", 0.0, assignment=Assignment("r0", (0,), 1))
    t.join(JoinRequest("x", 0, 1), 1.0)  # the second of two: a replica without an agent may be it
    with pytest.raises(FailedPrecondition, match=r"configured replicas \(r0\)"):
        t.join(JoinRequest("y", 0, 1), 1.0)


def test_a_sigkill_death_reason_quotes_no_unrelated_last_line():
    s = Driver(ControllerSettings(replicas=1, min_replicas=1))
    s.register("h0", "i0", 0.0, assignment=Assignment("r0", (0,), 1))
    s.join(JoinRequest("r0", 0, 1, host_id="h0"), 0.0)
    s.exit("h0", "r0", 0, 1.0, signal=9, stderr_tail="step 40 loss 2.1\n")
    assert s.view.replicas["r0"].reason == "trainer rank 0 on host h0 died (signal 9)"
    s.join(JoinRequest("r0", 0, 1, host_id="h0", incarnation="two"), 2.0)
    s.exit("h0", "r0", 0, 3.0, exit_code=1, stderr_tail="step 1\nRuntimeError: CUDA error\n",
                   version=s.view.hosts["h0"].assignment_version)
    assert s.view.replicas["r0"].reason == "trainer rank 0 on host h0 died (exit code 1): RuntimeError: CUDA error"
