"""Real processes: FSDP2 inside each replica, FTAR across replicas on the gradient shards.

Each replica's model is wrapped with fully_shard over its own 2 ranks (Gloo); FSDP2's
all-reduce hook hands every group's reduce-scatter output to FTAR (rank k with rank k of
the other replicas). Checked here: the result equals PyTorch's own HSDP bitwise, and a rank
SIGKILLed in the middle of backward costs the survivors one retry, after which the rebuilt
replica catches up shard by shard (rank 0 and rank 1 from different sources) and every
replica holds the same shards again; a whole job SIGKILLed resumes from its last sharded
DCP checkpoint and retraces the killed run bitwise, every batch trained once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fthsdp.state.checkpoint import CheckpointStore
from protos import job_secret
from tests import forked
from tests.runtime import history_checks as hc
from tests.runtime.cluster import REPO, Cluster, Faults, Records, free_port
from tests.trainer_secret import SECRET

pytestmark = pytest.mark.slow
FSDP = {"fsdp": True, "dump": True, "digest_every": 1}


def _reference(out: Path, replicas: int, ranks: int, steps: int) -> None:
    """PyTorch's own HSDP on the same data: one process per (replica, rank)."""
    out.mkdir()
    port = free_port()
    procs = []
    for global_rank in range(replicas * ranks):
        cfg = {"replicas": replicas, "ranks": ranks, "global_rank": global_rank, "port": port, "steps": steps,
               "out": str(out)}
        procs.append(forked.start("tests.runtime.hsdp_reference", [json.dumps(cfg)], log=out / f"reference-{global_rank}.log",
                                  env=dict(os.environ), cwd=REPO, pipes=False))
    for global_rank, proc in enumerate(procs):
        code = proc.wait(timeout=120)
        assert code == 0, (out / f"reference-{global_rank}.log").read_text()[-2000:]


@pytest.mark.timeout(300)
def test_fsdp2_under_fthsdp_ends_bitwise_equal_to_pytorch_hsdp(tmp_path):
    steps = 4
    # A long join timeout costs nothing (both replicas joined: the quorum answers at once) and
    # keeps a slow start from making step 0 a one-replica step, which PyTorch's HSDP never has.
    rec = Cluster(tmp_path / "ft", replicas=2, ranks=2, steps=steps, join_timeout_s=10.0, worker=FSDP).run(120.0)
    commits = rec.where(event="commit")
    assert {(r["replica"], r["rank"], r["step"]) for r in commits} == \
        {(str(r), k, s) for r in range(2) for k in range(2) for s in range(steps)}
    assert all(len(r["included"]) == 2 for r in commits)  # no step went without a replica
    hc.check_bitwise_identical_after_every_commit(rec, sharded=True)
    _reference(tmp_path / "ref", replicas=2, ranks=2, steps=steps)

    # Bitwise: in a 2 x 2 job every sum has two terms (a + b == b + a in IEEE arithmetic), and
    # both sides divide by the same powers of two, so the reduction order cannot show.
    for replica in range(2):
        for rank in range(2):
            ours = torch.load(tmp_path / "ft" / "records" / f"{replica}-{rank}-0.pt", weights_only=True)
            theirs = torch.load(tmp_path / "ref" / f"{replica}-{rank}.pt", weights_only=True)
            assert sorted(ours) == sorted(theirs)
            different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
            assert not different, f"replica {replica} rank {rank} differs from PyTorch's HSDP in {different}"
    first = torch.load(tmp_path / "ft" / "records" / "0-0-0.pt", weights_only=True)
    assert first["model/0.weight"].shape == (8, 8)  # rank 0 holds half of the 16 x 8 weight


@pytest.mark.timeout(300)
def test_sigkill_mid_backward_then_shard_by_shard_catch_up_from_two_sources(tmp_path):
    # The sources serve a copy taken at the step boundary (what a GPU source does: pinned host
    # memory) and train on while the rebuilt replica reads it.
    cluster = Cluster(tmp_path, replicas=3, ranks=2, steps=4, join_timeout_s=2.0,
                      worker={**FSDP, "copy_state_to_serve": True},
                      faults=Faults().sigkill(replica=1, at_step=2, rank=1))
    rec = cluster.run(timeout_s=150.0)

    killed = rec.where(event="killed")
    assert [(k["replica"], k["rank"], k["step"]) for k in killed] == [("1", 1, 2)]
    retried = {(r["replica"], r["step"]) for r in rec.where(event="retry")}
    assert {("0", 2), ("2", 2)} <= retried  # the survivors lost only that attempt...
    survivors = {r["step"] for r in rec.where(event="commit") if r["replica"] in ("0", "2")}
    assert survivors == set(range(max(survivors) + 1)) and max(survivors) >= 3  # ...and went on

    first = hc.check_restarted_replica_caught_up(rec, "1", sharded=True)
    caught = [r for r in rec.where(event="commit", replica="1", step=first["step"]) if r["incarnation"] > 0]
    assert {r["rank"]: r["source"] for r in caught} == {0: "0", 1: "2"}  # two sources, one per shard
    # Each rank fetched its own shard only: about half of the replica's state (2 ranks).
    full = _full_state_bytes()
    for row in caught:
        assert 0.4 * full < row["fetched_bytes"] < 0.6 * full + 4096, (row["fetched_bytes"], full)
    assert hc.check_bitwise_identical_after_every_commit(rec, sharded=True) >= 4
    hc.check_exactly_once(rec, replicas=3)


def _full_state_bytes() -> int:
    """Parameters and AdamW's two moments of the whole (unsharded) test model, in bytes."""
    from tests.runtime.train_worker import build_model

    params = sum(p.numel() * p.element_size() for p in build_model().parameters())
    return 3 * params


@pytest.mark.timeout(300)
def test_the_whole_job_killed_resumes_from_its_last_dcp_checkpoint_exactly_once(tmp_path):
    ckpt = tmp_path / "ckpt"
    # Every rank stops after committing step 5 and the whole job is SIGKILLed; the last checkpoint is
    # the state at the start of step 4 (written after committing step 3, every 4 steps). Both replicas
    # train every step (min_replicas=2): a replica that started late would join after the other had
    # stopped at step 5 and wait for it until the deadline.
    both = {"min_replicas": 2}
    first = Cluster(tmp_path / "run1", replicas=2, ranks=2, steps=50, join_timeout_s=10.0, checkpoint_every=4,
                    checkpoint_dir=ckpt, worker=FSDP, kill_all_after=5, controller_settings=both).run(timeout_s=120.0)
    assert max(r["step"] for r in first.where(event="commit")) == 5
    store = CheckpointStore(ckpt, key=SECRET.key(job_secret.PURPOSE_CHECKPOINT))
    assert store.steps() == [4] and store.latest_complete() == 4
    stranger = job_secret.parse(job_secret.generate(), "another job")  # signed with the job secret: not theirs
    assert CheckpointStore(ckpt, key=stranger.key(job_secret.PURPOSE_CHECKPOINT)).latest_complete() is None
    assert sorted(p.name for p in (ckpt / "step-0000000004").iterdir()) == \
        [".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp", "fthsdp.pt"]  # one DCP file per rank's shards

    second = Cluster(tmp_path / "run2", replicas=2, ranks=2, steps=7, join_timeout_s=10.0, checkpoint_every=4,
                     checkpoint_dir=ckpt, worker=FSDP, controller_settings=both).run(timeout_s=120.0)
    assert {r["step"] for r in second.where(event="started")} == {4}
    hc.check_bitwise_identical_after_every_commit(second, sharded=True)
    # The resumed job retraces the killed one bitwise: same state after steps 4 and 5, rank by rank.
    for step in (4, 5):
        before = {(r["replica"], r["rank"]): r["digest"] for r in first.where(event="commit", step=step)}
        after = {(r["replica"], r["rank"]): r["digest"] for r in second.where(event="commit", step=step)}
        assert before and all(after[k] == v for k, v in before.items()), step
    # Committed history as it survives: the killed run up to its checkpoint, then the resumed run.
    kept = Records([r for r in first.rows if r.get("event") not in ("commit", "retry") or r["step"] < 4] + second.rows)
    hc.check_exactly_once(kept, replicas=2)
