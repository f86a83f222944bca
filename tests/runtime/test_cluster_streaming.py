"""Real processes: two Streaming DiLoCo replicas (H = 6, F = 2 fragments: a sync of one fragment
every K = 3 inner steps, each overlapping TAU = 2 inner steps, the pseudo-gradient in bfloat16
on the wire) on a real controller. A replica SIGKILLed in the first inner step its fragment's
sync overlaps (the sync in flight) loses the inner steps since its last committed sync; the
survivor's sync goes on without it at the due step, and it syncs on alone; the rebuilt
replica's first quorum with it needs a catch-up, which the overlapped sync defers to a
blocking sync at the due step. After every committed sync the global state (global
parameters, every fragment's outer optimizer, ledger) is bitwise equal on every replica, and
each replica's batches are committed exactly once along the committed history, K per sync it
contributed to. (A catch-up quorum that finds one replica at its due step and the other in
flight costs the first one a ring connect timeout, 4 s here, before the retry that catches up.)
"""

from __future__ import annotations

import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster, Faults, Records

pytestmark = pytest.mark.slow

H, F, TAU = 6, 2, 2
K = H // F


def test_a_streaming_replica_killed_while_its_sync_is_in_flight_catches_up_and_every_batch_commits_once(tmp_path):
    rec = Cluster(tmp_path, replicas=2, ranks=1, steps=5, join_timeout_s=1.0,
                  worker={"sync_mode": "streaming_diloco", "sync_every": H, "fragments": F, "wire": "bfloat16",
                          "overlap": TAU, "allreduce_timeout_s": 4.0},  # a ring's connect: at most 4 s
                  module="tests.runtime.streaming_worker", faults=Faults().sigkill_inner(replica=1, at_step=2, inner=K - TAU),
                  controller_settings={"sync_mode": "streaming_diloco", "sync_every_steps": H,
                                       "sync_fragments": F}).run(timeout_s=150.0)
    [killed] = rec.where(event="killed")  # in inner step K - TAU of sync 2: that sync's begin went ahead
    assert (killed["step"], killed["inner"], killed["position"], killed["in_flight"]) == (2, K - TAU, 2 * K + 1, True)
    for r in ("0", "1"):  # K inner steps per fragment sync
        steps = [row["step"] for row in rec.where(event="trained", replica=r, incarnation=0)]
        assert steps[:2 * K] == [0] * K + [1] * K
    alone = [r for r in rec.where(event="commit", replica="0") if r["included"] == ["0"]]
    assert alone  # the survivor synced fragments on its own while replica 1 was gone
    first = hc.check_restarted_replica_caught_up(rec, "1")
    assert first["included"] == ["0"]
    assert hc.check_bitwise_identical_after_every_commit(rec) >= 5
    fragment_syncs = Records([{**r, "batches": K} if r["event"] == "commit" else r for r in rec.rows])
    batches = hc.check_exactly_once_along(hc.committed_history(fragment_syncs), fragment_syncs, ["0", "1"])
    mine = sorted(p for (rep, p) in batches if rep == "1")
    assert mine[:2 * K + 1] == list(range(2 * K + 1))  # the killed inner step's batch came again, once
    assert sorted(p for (rep, p) in batches if rep == "0") == list(range(len([
        r for r in rec.where(event="commit", replica="0")]) * K))
