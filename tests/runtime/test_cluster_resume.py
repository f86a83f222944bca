"""Real processes: a rollback resumes from the newest durable checkpoint instead of step 0.

Replica 0 trains alone and checkpoints every 2 steps (its leader reports each checkpoint
with its next step report). Replica 1 starts late without finding them -- as if it had
started before any was written -- and joins behind; replica 0 dies, every rank, as the
catch-up from it starts, and is not restarted. No live replica holds the newest step: the
controller waits for replica 0, then forms a rollback quorum offering the newest checkpoint
replica 0 reported, and replica 1 loads it on both ranks and trains on from there.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster, Faults

pytestmark = pytest.mark.slow


def controller_events(cluster: Cluster, kind: str) -> list[dict]:
    """The controller's event log lines of `kind` (JSON lines on its stderr)."""
    events = []
    for line in (cluster.workdir / "controller.log").read_text().splitlines():
        if line.startswith("{") and f'"kind": "{kind}"' in line:
            events.append(json.loads(line))
    return events


def test_a_rollback_resumes_from_the_newest_durable_checkpoint_instead_of_step_0(tmp_path):
    cluster = Cluster(tmp_path, replicas=2, ranks=2, steps=4, late={1: 3}, checkpoint_every=2, join_timeout_s=0.5,
                      faults=Faults().kill_source(replica=0).fresh_start(replica=1), no_restart=frozenset({0}),
                      controller_settings={"rollback_wait_s": 1.0}, overrides={1: {"commits": 3}})
    rec = cluster.run(timeout_s=90.0)

    assert [r["step"] for r in rec.where(event="started", replica="1")] == [0, 0]  # it found no checkpoint
    assert {r["rank"] for r in rec.where(event="killed", replica="0")} == {0, 1}
    [rollback] = controller_events(cluster, "rollback")
    offered = int(re.search(r"from the checkpoint of step (\d+)", rollback["message"])[1])
    assert offered >= 1 and cluster.checkpoint_dir.joinpath(f"step-{offered + 1:010d}", "model_optim.pt").exists()

    # Replica 1 trained on from the checkpoint's state, on both ranks: nothing before it again.
    mine = rec.where(event="commit", replica="1")
    assert sorted(r["step"] for r in mine) == sorted(2 * [offered + 1, offered + 2, offered + 3])
    [checkpointed] = {r["digest"] for r in rec.where(event="commit", replica="0", step=offered)}
    first = [r for r in mine if r["step"] == offered + 1]
    assert all(not r["behind"] and r["before"] == checkpointed for r in first)

    # One history: replica 0's steps up to the checkpoint, then replica 1's; what replica 0
    # committed after the checkpoint was rolled back and counts nothing.
    assert hc.check_identical_within_each_commit(rec) >= offered + 4
    history = hc.committed_history(rec)
    assert [c.step for c in history.chain] == list(range(offered + 4))
    assert {c.step for c in history.abandoned} == {r["step"] for r in rec.where(event="commit", replica="0")
                                                   if r["step"] > offered}
    batches = hc.check_exactly_once_along(history, rec, ["0", "1"])
    assert sorted(p for (r, p) in batches if r == "1") == [0, 1, 2]
