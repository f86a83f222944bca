"""Real processes: two DiLoCo replicas (H = 4 inner steps per sync) on a real controller; replicas of one
rank, and of two DDP ranks (the pseudo-gradient split between the ranks on its way across replicas).

After every committed sync the global state (parameters, outer optimizer, ledger) is bitwise
equal on every replica; along the committed history each replica's batches are committed exactly
once, H per sync it contributed to. A replica SIGKILLed in the middle of its inner steps loses
them: the survivor syncs on alone, the rebuilt replica catches up at a sync point and ends
bitwise equal, and the batches it lost are trained again. In the two SIGKILL tests the batches
come through a real DataLoader with worker processes (prefetching ahead of the ledger): after the
kill and the catch-up each inner step still trains the batch its ledger position names. A whole
job killed between two syncs resumes from the checkpoint of its last sync.
"""

from __future__ import annotations

import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster, Faults, Records
from tests.runtime.train_worker import BATCH_ROWS

pytestmark = pytest.mark.slow

H = 4
DILOCO = {"sync_mode": "diloco", "sync_every": H}
CONTROLLER = {"sync_mode": "diloco", "sync_every_steps": H}
WORKER = "tests.runtime.semisync_worker"
SAMPLES, LOADER_WORKERS = 256, 2  # each replica's part of an epoch: 16 batches, so the kill tests cross into epoch 1
LOADER = {**DILOCO, "loader_workers": LOADER_WORKERS, "samples": SAMPLES}


def _served_by_the_loader(rec: Records) -> int:
    return hc.check_loader_served_ledger_positions(rec, SAMPLES, BATCH_ROWS, 2, LOADER_WORKERS)


def _committed_batches(rec: Records) -> dict[str, list[int]]:
    walked = hc.committed_history(rec)
    batches = hc.check_exactly_once_along(walked, rec, ["0", "1"])
    return {r: sorted(p for (rep, p) in batches if rep == r) for r in ("0", "1")}


def test_diloco_replicas_of_two_ddp_ranks_are_bitwise_equal_after_every_sync_and_train_each_batch_once(tmp_path):
    rec = Cluster(tmp_path, replicas=2, ranks=2, steps=3, join_timeout_s=10.0, worker=DILOCO, module=WORKER,
                  controller_settings={**CONTROLLER, "min_replicas": 2}).run(timeout_s=150.0)
    assert hc.check_bitwise_identical_after_every_commit(rec) == 3  # every rank of every replica: one state
    assert {r["rank"] for r in rec.where(event="commit")} == {0, 1}
    for r in ("0", "1"):  # H inner steps per sync, none of them seen by the controller
        assert [row["step"] for row in rec.where(event="trained", replica=r, rank=0)] == [0] * H + [1] * H + [2] * H
    assert _committed_batches(rec) == {"0": list(range(3 * H)), "1": list(range(3 * H))}


def test_fsdp2_replicas_sync_each_ranks_own_shards_and_stay_bitwise_equal_rank_by_rank(tmp_path):
    rec = Cluster(tmp_path, replicas=2, ranks=2, steps=2, join_timeout_s=10.0, worker={**DILOCO, "fsdp": True},
                  module=WORKER, controller_settings={**CONTROLLER, "min_replicas": 2}).run(timeout_s=150.0)
    assert hc.check_bitwise_identical_after_every_commit(rec, sharded=True) == 2
    digests = {r["rank"]: r["digest"] for r in rec.where(event="commit", replica="0", step=1)}
    assert digests[0] != digests[1]  # each rank holds (and digests) its own shards
    rank_0 = Records([r for r in rec.rows if r["rank"] == 0])  # the history of one rank's shards
    assert _committed_batches(rank_0) == {"0": list(range(2 * H)), "1": list(range(2 * H))}


def test_a_replica_killed_between_syncs_loses_its_inner_steps_and_catches_up_at_a_sync(tmp_path):
    rec = Cluster(tmp_path, replicas=2, ranks=1, steps=4, join_timeout_s=1.0, worker=LOADER, module=WORKER,
                  faults=Faults().sigkill_inner(replica=1, at_step=1, inner=2),
                  controller_settings=CONTROLLER).run(timeout_s=150.0)
    [killed] = rec.where(event="killed")
    assert (killed["step"], killed["inner"], killed["position"]) == (1, 2, H + 2)
    # the survivor synced on alone (weights by contributors)
    alone = [r for r in rec.where(event="commit", replica="0") if r["included"] == ["0"]]
    assert alone and all(r["lr_scale"] < 1.0 for r in alone)
    first = hc.check_restarted_replica_caught_up(rec, "1")
    assert first["included"] == ["0"]  # it contributed nothing while behind
    assert hc.check_bitwise_identical_after_every_commit(rec) >= 4
    batches = _committed_batches(rec)
    # the killed replica's inner steps of sync 1 never entered the history; those batches came again
    assert batches["1"][:2 * H] == list(range(2 * H))
    lost = [r["position"] for r in rec.where(event="trained", replica="1", incarnation=0, step=1)]
    assert lost == [H, H + 1] and set(lost) <= set(batches["1"])
    assert _served_by_the_loader(rec) >= 4 * 2 * H + 2


def test_a_replica_killed_during_a_sync_is_left_out_of_its_retry_and_catches_up_at_the_next(tmp_path):
    rec = Cluster(tmp_path, replicas=2, ranks=1, steps=4, join_timeout_s=1.0, worker=LOADER, module=WORKER,
                  faults=Faults().sigkill(replica=1, at_step=1), controller_settings=CONTROLLER).run(timeout_s=150.0)
    [killed] = rec.where(event="killed")
    assert (killed["replica"], killed["step"]) == ("1", 1)
    # the survivor's sync 1 committed without it: its pseudo-gradient, not the dead replica's
    [sync_1] = [r for r in rec.where(event="commit", replica="0", step=1)]
    assert sync_1["included"] == ["0"]
    hc.check_restarted_replica_caught_up(rec, "1")
    assert hc.check_bitwise_identical_after_every_commit(rec) >= 4
    batches = _committed_batches(rec)
    assert batches["1"][:2 * H] == list(range(2 * H))  # its inner steps of sync 1 were trained again
    assert _served_by_the_loader(rec) >= 4 * 2 * H + H


def test_a_job_killed_between_syncs_resumes_from_the_checkpoint_of_its_last_sync(tmp_path):
    ckpt, both = tmp_path / "ckpt", {**CONTROLLER, "min_replicas": 2}
    first = Cluster(tmp_path / "run1", replicas=2, ranks=1, steps=50, join_timeout_s=10.0, checkpoint_every=1,
                    checkpoint_dir=ckpt, worker={**DILOCO, "stop_inner": 2}, module=WORKER, kill_all_after=1,
                    controller_settings=both).run(timeout_s=120.0)
    uncommitted = [r["position"] for r in first.where(event="trained", replica="0", step=2)]
    assert uncommitted == [2 * H, 2 * H + 1]  # killed two inner steps into sync 2
    second = Cluster(tmp_path / "run2", replicas=2, ranks=1, steps=4, join_timeout_s=10.0, checkpoint_every=1,
                     checkpoint_dir=ckpt, worker=DILOCO, module=WORKER, controller_settings=both).run(timeout_s=120.0)
    assert {(r["step"], r["position"]) for r in second.where(event="started")} == {(2, 2 * H)}
    hc.check_bitwise_identical_after_every_commit(second)
    [after_1] = {r["digest"] for r in first.where(event="commit", step=1)}
    assert {r["before"] for r in second.where(event="commit", step=2)} == {after_1}  # the checkpoint's global state
    kept = Records(first.rows + second.rows)
    assert _committed_batches(kept) == {"0": list(range(4 * H)), "1": list(range(4 * H))}
