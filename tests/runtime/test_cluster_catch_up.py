"""Real processes: a replica that joins late catches up the whole training state, bitwise.

The issue's scenario: AdamW, a StepLR schedule, a stateful sampler and dropout (so the RNG
streams matter), 2 replicas x 2 ranks, replica 1 started only after replica 0 committed
step 4. After its catch-up step the two replicas must hold the same weights, optimizer
state, schedule, sampler and RNG streams -- and keep doing so at every later commit.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster

pytestmark = pytest.mark.slow


def test_a_late_replica_catches_up_weights_optimizer_schedule_sampler_and_rng(tmp_path):
    cluster = Cluster(tmp_path, replicas=2, ranks=2, steps=8, late={1: 4}, join_timeout_s=0.5,
                      worker={"stateful": True, "digest_every": 0})
    rec = cluster.run(timeout_s=100.0)

    first = rec.where(event="commit", replica="1")[0]
    assert first["behind"] and first["step"] >= 4, first
    sources = [r for r in rec.where(event="commit", step=first["step"]) if r["replica"] == "0"]
    assert sources
    for key in ("digest", "sched", "epoch", "rng"):
        assert {str(r[key]) for r in sources + [first]} == {str(first[key])}, key
    assert first["sched"]["last_epoch"] == first["step"] + 1 and first["epoch"] >= 1  # they had moved on
    assert first["positions_before"].get("1", 0) == 0  # it never trained before: it starts its stream at 0

    assert hc.check_bitwise_identical_after_every_commit(rec) >= 8  # the digest covers registered state
    rng_by_step = defaultdict(set)
    for row in rec.where(event="commit"):
        rng_by_step[row["step"]].add(row["rng"])
    assert all(len(v) == 1 for v in rng_by_step.values()), dict(rng_by_step)
    hc.check_exactly_once(rec, replicas=2)
    # Both leaders asked on the controller's quorum port from their second quorum on, and
    # never had to fall back to the stream.
    for replica in ("0", "1"):
        logs = "".join(p.read_text() for p in cluster.workdir.glob(f"worker-{replica}-0-*.log"))
        assert "quorums go to the quorum port 127.0.0.1:" in logs and "on gRPC" not in logs
