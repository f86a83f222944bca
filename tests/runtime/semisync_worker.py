"""One trainer process of the semi-synchronous cluster tests (tests/runtime/test_cluster_semisync.py).

Run as `python -m tests.runtime.semisync_worker CONFIG_JSON` by tests/runtime/cluster.py: train_worker's
model and data, AdamW inside the replica, the loop a sync-mode script would write; the mode comes
from the config ("sync_mode", "sync_every"). A replica of several ranks trains through DDP
(its own all-reduce inside the replica: no comm hook), or with "fsdp" through FSDP2's
fully_shard (each rank syncs its own shards), each rank on its rows of the batch. Rows written to config["record"] (fthsdp/history.py
reads them):
- "trained" per inner step: the sync it trains for (step) and the batch position;
- "commit" per committed sync: included, positions_before, batches (H), behind, before (the
  global state the sync trained from, "" when it caught up), digest (the global state after it:
  parameters, outer optimizer, ledger; the inner optimizer is each replica's own);
- "killed" right before a fault's SIGKILL (in_flight: streaming_diloco's overlapped sync was
  under way), "stopped" where the whole-job kill waits.
"allreduce_timeout_s" (default 10) also bounds each FTAR ring's connect.
Faults (first incarnation only): {"kind": "sigkill_inner", "replica", "step", "inner"} SIGKILLs
the process in that inner step of that sync, before its optimizer step; {"kind": "sigkill",
"replica", "step"} once the FTAR all-reduce of that sync's pseudo-gradient started (mid-sync). With "stop_after": after
committing that sync and training "stop_inner" more inner steps, the worker waits to be killed.
With "holds" (a list of {"phase", "step", "release"}; rank 0 of the first incarnation): where the
phase says, in that sync, the worker writes "held" and waits, bounded, until the file "release"
names exists ("released"); the test does its deed meanwhile (a controller failover). Phases:
"allreduce", right before the all-reduce of the sync's pseudo-gradient (its quorum answered,
nothing committed); "quorum", before the replica's join for the sync is sent.
With "loader_workers": N >= 1, batches come through a real torch DataLoader with N worker processes
(fthsdp.data.ShuffledLoader over data_worker's Samples, "samples" of them, BATCH_ROWS a batch, seed
0: this replica's part of each shuffled epoch) at the ledger's position; each "trained" row names
the batch's sample ids and the DataLoader workers that read it. Without it, train_worker's batch_at.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, Seams
from fthsdp.data import ReplicaShard, ShuffledLoader
from tests.runtime.data_worker import Samples
from tests.runtime.faults import HoldBeforeQuorum, HoldWhenAllreduceStarts, KillWhenAllreduceStarts
from tests.runtime.train_worker import BATCH_ROWS, batch_at, build_model, record_writer, shard_model
from tests.waiting import wait_until

#: how long a held sync waits for the test to let it go on
HOLD_TIMEOUT_S = 60.0


def loader_for(cfg: dict) -> ShuffledLoader:
    """This replica's DataLoader (the test rebuilds its order to check what was served)."""
    return ShuffledLoader(Samples(cfg["samples"]), batch_size=BATCH_ROWS,
                          shard=ReplicaShard.of(cfg["replica_id"], cfg["replicas"]), seed=0,
                          num_workers=cfg["loader_workers"])


def main(cfg: dict) -> int:
    write = record_writer(cfg)

    mine = [f for f in cfg.get("faults", []) if f["replica"] == cfg["replica_id"] and cfg["incarnation"] == 0]
    kills = {(f["step"], f["inner"]) for f in mine if f["kind"] == "sigkill_inner"}
    mid_sync = {f["step"] for f in mine if f["kind"] == "sigkill"}
    h, world = cfg["sync_every"], cfg["world_size"]
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['gloo_port']}", rank=cfg["rank"],
                                world_size=world, timeout=timedelta(seconds=20))
        group = dist.group.WORLD
    loader = loader_for(cfg) if cfg.get("loader_workers") else None
    holds = {(x["phase"], x["step"]): x["release"] for x in cfg.get("holds", [])
             if cfg["incarnation"] == 0 and cfg["rank"] == 0}
    model = build_model()
    if cfg.get("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        shard_model(model, init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    settings = RuntimeSettings.from_env(
        job_id=cfg.get("job_id", "t"), replica_id=cfg["replica_id"], rank=cfg["rank"], world_size=world,
        controller_address=cfg["controller"], coordinator_address=cfg["coordinator_address"], max_retries=4,
        quorum_timeout_s=30.0, allreduce_timeout_s=cfg.get("allreduce_timeout_s", 10.0), gather_timeout_s=15.0,
        fetch_timeout_s=10.0,
        fetch_hold_timeout_s=5.0, heartbeat_interval_s=0.5, checkpoint_dir=cfg.get("checkpoint_dir", ""),
        checkpoint_every_steps=cfg.get("checkpoint_every", 0), digest_every_steps=1, ftar_chunk_bytes=64 << 10,
        sync_mode=cfg["sync_mode"], sync_every_steps=h)

    def pre_init() -> None:
        if loader is not None:
            loader.start()  # the DataLoader's workers fork before the trainer's ports and threads start
        print("ready", flush=True)  # the cluster answers "go" once every first-incarnation worker is ready
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("no go from the cluster")

    def killing_now() -> bool:
        return manager.plan is not None and manager.plan.step in mid_sync

    def hold(phase: str, step: int, **seen) -> None:  # once per entry of `holds`
        release = Path(holds.pop((phase, step)))
        write(event="held", phase=phase, step=step, **seen)
        wait_until(release.exists, HOLD_TIMEOUT_S, f"{release} (the test lets the sync go on)", every_s=0.02)
        write(event="released", phase=phase, step=step)

    def holding_sync() -> bool:
        return manager.plan is not None and ("allreduce", manager.plan.step) in holds

    seams = Seams(endpoint=lambda ep: HoldWhenAllreduceStarts(KillWhenAllreduceStarts(
        ep, killing_now, lambda: write(event="killed", step=manager.plan.step, inner=manager.inner,
                                       in_flight=manager.sync_in_flight),
        lambda: os.kill(os.getpid(), signal.SIGKILL)),
        holding_sync, lambda: hold("allreduce", manager.plan.step, quorum_id=manager.plan.quorum_id)),
        controller=lambda c: HoldBeforeQuorum(c, lambda step: ("quorum", step) in holds,
                                              lambda step: hold("quorum", step)))
    manager = Manager(model, opt, settings, process_group=group, pre_init=pre_init, seams=seams).start()
    ddp = world > 1 and not cfg.get("fsdp")
    forward = torch.nn.parallel.DistributedDataParallel(model, process_group=group) if ddp else model
    write(event="started", step=manager.step, position=manager.ledger.position(cfg["replica_id"]))
    ft_opt = FaultTolerantOptimizer(manager, opt)
    batches = manager.batches(batch_at if loader is None else loader.batch_at)
    full, before, stop_inner = False, "", None
    while not (manager.step >= cfg["steps"] and full) and manager.step < cfg["max_steps"]:
        batch = next(batches)
        x, y = (batch["x"], batch["y"]) if loader is not None else batch
        served = {} if loader is None else {"samples": batch["index"].tolist(),
                                            "workers": sorted(set(batch["worker"].tolist()))}
        step, inner = manager.step, batches.last_position - manager.ledger.position(cfg["replica_id"])
        if inner == 0:
            before = manager.digest()  # the global state this sync trains from (unless it turns out behind)
        if stop_inner is not None and inner == stop_inner:
            write(event="stopped", step=step)
            sys.stdin.readline()
            raise SystemExit("the cluster should have killed this worker")
        if (step, inner) in kills:
            write(event="killed", step=step, inner=inner, position=batches.last_position,
                  in_flight=manager.sync_in_flight)
            os.kill(os.getpid(), signal.SIGKILL)
        write(event="trained", step=step, position=batches.last_position, **served)
        ft_opt.zero_grad()
        rows = slice(cfg["rank"], None, world)
        torch.nn.functional.mse_loss(forward(x[rows]), y[rows]).backward()
        ft_opt.step()
        if manager.step == step:
            continue  # an inner step; the sync comes with the H-th
        out = manager.last_outcome
        full = len(out.included) == cfg["replicas"]
        write(event="commit", step=out.step, quorum_id=out.quorum_id, behind=out.behind, included=list(out.included),
              positions_before=out.positions_before, batches=h, lr_scale=out.lr_scale,
              before="" if out.behind else before, digest=manager.digest())
        if out.step == cfg.get("stop_after"):
            stop_inner = cfg.get("stop_inner", 0)
    write(event="done", step=manager.step)
    manager.close()
    if loader is not None:
        loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
