"""A shuffling DataLoader with worker processes under the runtime, a trainer SIGKILLed mid-epoch:
every sample is trained exactly once along the committed history, and the replicas agree.

The trainer is README's snippet (tests/runtime/data_worker.py): `fthsdp.data.ShuffledLoader` over
a map-style Dataset, two DataLoader workers per trainer, `manager.batches(loader.batch_at)`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster

pytestmark = pytest.mark.slow

SAMPLES, REPLICAS, BATCH, SEED = 96, 3, 4, 0
PER_REPLICA = SAMPLES // REPLICAS
PER_EPOCH = PER_REPLICA // BATCH


def reference(replica: int, position: int) -> list[int]:
    """The documented order, written out: epoch e's permutation of the whole dataset, seeded by
    (seed, e); replica i reads every REPLICAS-th sample of it from i; position p is batch p % PER_EPOCH."""
    epoch, batch = divmod(position, PER_EPOCH)
    part = np.random.default_rng([SEED, epoch]).permutation(SAMPLES)[replica::REPLICAS][:PER_REPLICA]
    return part[batch * BATCH:(batch + 1) * BATCH].tolist()


def test_sigkill_mid_epoch_trains_every_sample_once_along_the_committed_history(tmp_path):
    cluster = Cluster(tmp_path, replicas=REPLICAS, ranks=1, steps=40, join_timeout_s=2.0,
                      module="tests.runtime.data_worker",
                      worker={"samples": SAMPLES, "kill_replica": "1", "kill_after": 12})
    rec = cluster.run(timeout_s=150.0)

    (killed,) = rec.where(event="killed")
    assert (killed["replica"], killed["incarnation"], killed["step"]) == ("1", 0, 13)
    assert 13 % PER_EPOCH != 0  # mid-epoch

    # Exactly once along the committed history, and the same state everywhere.
    walked = hc.committed_history(rec)
    batches = hc.check_exactly_once_along(walked, rec, [str(r) for r in range(REPLICAS)])
    assert hc.check_bitwise_identical_after_every_commit(rec) == 40
    first = hc.check_restarted_replica_caught_up(rec, "1")
    assert first["positions_before"]["1"] == 13  # the batch it was training when killed was never committed

    # The data each included batch held was the documented batch at the ledger's position.
    assert hc.check_included_samples(walked, rec, lambda replica, p: reference(int(replica), p)) == len(batches)
    # So each complete epoch of each replica held its part once, and the parts do not overlap.
    for epoch in range(min(n for n in (sum(1 for (r, _) in batches if r == str(i)) // PER_EPOCH
                                       for i in range(REPLICAS)))):
        seen = [sorted(s for p in range(epoch * PER_EPOCH, (epoch + 1) * PER_EPOCH) for s in reference(i, p))
                for i in range(REPLICAS)]
        assert all(len(set(part)) == PER_REPLICA for part in seen)
        assert len(set().union(*map(set, seen))) == REPLICAS * PER_REPLICA

    # The survivors retried the step the kill broke and trained the same samples again: the loader
    # went back to the ledger's position, dropping what its workers had prefetched.
    retried = [r for r in rec.where(event="retry") if r["replica"] != "1" and r["step"] == 13]
    assert retried, "no survivor retried the step the kill broke"
    for row in retried:
        (commit,) = [c for c in rec.where(event="commit", replica=row["replica"], step=13)]
        assert row["samples"] == commit["samples"]
    # Every batch came from the DataLoader's worker processes, the restarted trainer's too.
    rows = rec.where(event="commit")
    assert all(r["workers"] and min(r["workers"]) >= 0 for r in rows)
    assert {w for r in rows if r["replica"] == "1" and r["incarnation"] == 1 for w in r["workers"]} == {0, 1}
