"""One trainer process of the data cluster test: README's training function, as it stands there.

Run as `python -m tests.runtime.data_worker CONFIG_JSON` (tests/runtime/cluster.py's config).
The region between the README markers below is README.md's snippet, character for character
(tests/docs/test_readme_snippet.py keeps them equal); around it, this test's part: the
dataset, the settings, and `log_step`, which writes one JSON line per step attempt to
config["record"] (the rows fthsdp/history.py walks, plus the sample ids and the DataLoader
worker of the batch the step trained), and arms the fault: with config "kill_replica" and
"kill_after", that replica's first incarnation gets a real SIGKILL in the forward pass of
the step after it committed "kill_after" -- mid-step, mid-epoch, with batches prefetched by
its DataLoader workers. Survivors pace themselves until the killed replica is back
(a bounded wait per step), so it rejoins before the run ends.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from torch.utils.data import get_worker_info

from tests.waiting import wait_until

# README: begin
from typing import Callable

import torch
from torch.utils.data import Dataset

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
from fthsdp.data import ReplicaShard, ShuffledLoader


def train(model: torch.nn.Module, dataset: Dataset, settings: RuntimeSettings, replicas: int,
          log_step: Callable[[Manager, dict], None] = lambda manager, batch: None) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=settings.max_steps)
    shard = ReplicaShard.of(settings.replica_id, replicas)  # replica "r2" of 4 reads part 2 of each epoch
    loader = ShuffledLoader(dataset, batch_size=4, shard=shard, seed=0, num_workers=2)  # a real DataLoader
    manager = Manager(model, opt, settings, pre_init=loader.start)  # workers fork before the ports open
    manager.register_state("scheduler", scheduler)  # replicated state: it travels with catch-up
    manager.register_rng()                          # and so do the torch / numpy / Python RNG streams
    manager.start()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    for batch in manager.batches(loader.batch_at):  # the batch at this replica's ledger position
        ft_opt.zero_grad()          # this step's quorum; catch-up runs meanwhile if this replica is behind
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        if ft_opt.step(loss):       # FTAR across replicas, two-phase commit inside the replica
            scheduler.step()        # registered state changes between steps only
        log_step(manager, batch)    # metrics, logs: manager.last_outcome, manager.digest()
    manager.close()                 # the loop ended (max_steps, or the job COMPLETED): the replica FINISHED
    loader.close()
# README: end


class Samples(Dataset):
    """Sample i: 8 features and a target, functions of i only; each item says which sample it
    is and which DataLoader worker read it (-1: the training process itself)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        worker = get_worker_info()
        return {"index": i, "worker": -1 if worker is None else worker.id, "x": x, "y": x.sum(dim=0, keepdim=True) * 0.5}


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # every replica starts from the same weights
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def main(cfg: dict, run: Callable[..., None] = train, dataset: Dataset | None = None) -> int:
    """This test's part around `run` (README's `train` unless another trainer reuses it)."""
    replica, incarnation = cfg["replica_id"], cfg["incarnation"]
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s r{replica} %(name)s: %(message)s")
    record = open(cfg["record"], "a", buffering=1)  # noqa: SIM115 - the process's record, for its lifetime
    records = Path(cfg["record"]).parent
    victim = cfg.get("kill_replica")

    def write(**fields) -> None:
        record.write(json.dumps({"t": time.time(), "replica": replica, "rank": cfg["rank"],
                                 "incarnation": incarnation, **fields}) + "\n")

    def victim_back() -> bool:
        path = records / f"{victim}-0-1.jsonl"
        return path.exists() and '"event": "commit"' in path.read_text()

    def victim_killed() -> bool:
        path = records / f"{victim}-0-0.jsonl"
        return path.exists() and '"event": "killed"' in path.read_text()

    model = build_model()
    armed = {"kill": False, "step": -1}

    def kill_in_forward(module, args) -> None:  # mid-step: after the quorum, before the all-reduce
        if armed["kill"]:
            write(event="killed", step=armed["step"])
            os.kill(os.getpid(), signal.SIGKILL)

    model.register_forward_pre_hook(kill_in_forward)
    last = {"digest": ""}

    def log_step(manager: Manager, batch: dict, **more) -> None:
        out = manager.last_outcome
        digest = manager.digest()
        before = "" if out.behind else last["digest"]  # the state this attempt trained from
        last["digest"] = digest
        write(event="commit" if out.committed else "retry", step=out.step, quorum_id=out.quorum_id,
              behind=out.behind, included=list(out.included), positions_before=out.positions_before,
              position=out.positions_before.get(replica, 0), samples=batch["index"].tolist(),
              workers=sorted(set(batch["worker"].tolist())), lr=manager.optimizer.param_groups[0]["lr"],
              before=before, digest=digest, **more)
        if replica == victim and incarnation == 0 and out.committed and out.step == cfg["kill_after"]:
            armed.update(kill=True, step=out.step + 1)
        elif replica != victim and victim is not None and victim_killed() and not victim_back():
            try:  # pace the survivors until the killed replica rejoined (bounded per step)
                wait_until(victim_back, timeout_s=1.0, what="the killed replica's first commit")
            except AssertionError:
                pass

    settings = RuntimeSettings.from_env(
        job_id="t", replica_id=replica, rank=cfg["rank"], world_size=cfg["world_size"], max_steps=cfg["steps"],
        controller_address=cfg["controller"], coordinator_address=cfg["coordinator_address"], max_retries=4,
        quorum_timeout_s=30.0, allreduce_timeout_s=10.0, gather_timeout_s=15.0, fetch_timeout_s=10.0,
        fetch_hold_timeout_s=5.0, heartbeat_interval_s=0.5, digest_every_steps=5, ftar_chunk_bytes=64 << 10)
    write(event="pre_init")
    print("ready", flush=True)  # the cluster answers "go" once every first-incarnation worker is ready
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the cluster")
    run(model, Samples(cfg["samples"]) if dataset is None else dataset, settings, cfg["replicas"], log_step)
    write(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
