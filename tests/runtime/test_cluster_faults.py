"""Real processes on loopback: a controller (CLI) and replicas of trainer processes with injected faults.

These check the invariants of docs/architecture.md from the recorded history: bitwise-identical state after
every commit, exactly-once data, catch-up of a restarted replica, untouched state after a
failed step, and the survivors' wait bounded by the configured detection bound.
"""

from __future__ import annotations

import math

import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster, Faults

pytestmark = pytest.mark.slow


def test_kill_during_allreduce_and_abort_keep_history_consistent(tmp_path):
    # join_timeout_s=2 leaves a slow-starting replica time to join the first quorum on a loaded machine.
    cluster = Cluster(tmp_path, replicas=3, ranks=2, steps=10, join_timeout_s=2.0,
                      faults=Faults().kill(replica=1, at_step=4).abort(replica=2, at_step=7, rank=1))
    rec = cluster.run(timeout_s=110.0)

    assert hc.check_bitwise_identical_after_every_commit(rec) >= 10
    batches = hc.check_exactly_once(rec, replicas=3)
    assert ("2", 7) in batches  # replica 2 aborted step 7, but the others included its batch once
    # The peer killed mid-all-reduce made the survivors retry step 4 with nothing applied.
    retried = {(r["replica"], r["step"]) for r in rec.where(event="retry")}
    assert {("0", 4), ("2", 4), ("2", 7)} <= retried
    assert hc.check_retries_left_state_untouched(rec) >= 3
    first = hc.check_restarted_replica_caught_up(rec, "1")
    assert first["positions_before"]["1"] == 4  # it resumes its stream where committed history left it
    # Survivors' wait after the kill, against the configured detection bound (plus one ordinary step).
    bound = cluster.heartbeat_timeout_s + cluster.join_timeout_s + hc.longest_fault_free_step_s(rec)
    waits = hc.survivor_waits_after_kill(rec)
    assert waits and max(waits) <= bound, f"survivors waited {waits}, bound {bound:.2f}s"
    # lr follows the quorum answer: sqrt(healthy / total).
    two_of_three = [r for r in rec.where(event="commit") if len(r["included"]) == 2]
    assert two_of_three and all(r["lr_scale"] == pytest.approx(math.sqrt(2 / 3)) for r in two_of_three)


def test_checkpoints_resume_the_whole_job_exactly_once_through_ddp(tmp_path):
    """Both runs train through DistributedDataParallel with the runtime's comm hook."""
    ckpt = tmp_path / "ckpt"
    first = Cluster(tmp_path / "run1", replicas=2, ranks=1, steps=6, checkpoint_every=3,
                    checkpoint_dir=ckpt, ddp=True).run(timeout_s=90.0)
    hc.check_bitwise_identical_after_every_commit(first)
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))[-1] == "step-0000000006"
    second = Cluster(tmp_path / "run2", replicas=2, ranks=1, steps=9, checkpoint_every=3,
                     checkpoint_dir=ckpt, ddp=True).run(timeout_s=90.0)
    started = second.where(event="started")
    assert {r["step"] for r in started} == {6}
    hc.check_bitwise_identical_after_every_commit(second)
    both = type(first)(first.rows + second.rows)
    hc.check_exactly_once(both, replicas=2)
