"""Example trainer: a small model trained under FT-HSDP, one process per (replica, rank).

Run by an agent (`fthsdp agent ... -- python /opt/fthsdp/train.py`, the DaemonSets in
deploy/kustomize/base/agent.yaml), or by torchrun for a replica of several ranks
(`torchrun --nproc-per-node 8 train.py`, with FTHSDP_CONTROLLER set). Its rank layout comes
from the variables the agent (or torchrun) sets, through `RuntimeSettings.from_env`
(fthsdp/settings.py): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/MASTER_PORT (the replica's
rank-0 host, where the torch.distributed group inside the replica meets) and the FTHSDP_*
variables (replica, controller, coordinator address); the flags below override single
fields. `bind_host` (where FTAR, the state server and, on rank 0, the coordinator listen)
defaults to $POD_IP when set.

The device: with CUDA present, rank LOCAL_RANK's GPU (the agent gives each trainer its slot, a
standby too), NCCL inside the replica and FTAR on CUDA tensors across replicas (the `cuda`
extra); without, the CPU and Gloo. Checkpoints (FTHSDP_CHECKPOINT_DIR, every
FTHSDP_CHECKPOINT_EVERY_STEPS) go to a folder of their own per job, <dir>/<job id>: a new job
starts from step 0, a restarted one resumes from its own.

On a warm spare the agent starts it as a standby (FTHSDP_STANDBY=1, `--standby`): it does
everything that does not depend on its assignment first (imports, the model built with the
job's seed, the optimizer, one forward/backward on a dummy batch to prime the kernels, the
allocator and the data path), then waits for the agent's hand-over and goes on exactly as a
cold start would: the state it built is the same either way.
"""
from __future__ import annotations

import argparse
import logging
import os
import zlib
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, is_standby, wait_for_assignment
from fthsdp.process_group import init_replica_group

# RuntimeSettings fields that may be set by a flag (--controller-address ...); a flag left
# out keeps the environment's value, or the default.
SETTINGS_FLAGS = {"controller_address": str, "replica_id": str, "bind_host": str, "max_steps": int,
                  "checkpoint_dir": str, "checkpoint_every_steps": int}

log = logging.getLogger("train")


def batch_at(replica_id: str, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica `replica_id`'s batch number `position`: a function of both only, so a retried
    step sees the same batch and a caught-up replica continues where its ledger says."""
    g = torch.Generator().manual_seed(zlib.crc32(replica_id.encode()) * 1_000_003 + position)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def device() -> torch.device:
    """This rank's device: GPU LOCAL_RANK when CUDA is present (a standby gets its slot as
    LOCAL_RANK from the agent, so standbys on one host build on different GPUs), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def job_checkpoints(checkpoint_dir: str, job_id: str) -> str:
    """The job's own checkpoint folder under the shared volume ("" when checkpoints are off)."""
    return os.path.join(checkpoint_dir, job_id) if checkpoint_dir else ""


def build(lr: float, on: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer,
                                                 torch.optim.lr_scheduler.LRScheduler]:
    """The model, optimizer and schedule: nothing here depends on the replica or rank, so a
    standby builds them before it has an assignment."""
    torch.manual_seed(0)  # every replica starts from the same weights
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(on)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=200, gamma=0.5)


def prime(model: torch.nn.Module) -> None:
    """One forward/backward on a dummy batch (made by the data path, from its own generator):
    kernels, autograd and the allocator are warm. The weights, the global RNG and the
    optimizer are untouched; the gradients are dropped."""
    on = next(model.parameters()).device
    x, y = batch_at("standby-warm-up", 0)
    torch.nn.functional.mse_loss(model(x.to(on)), y.to(on)).backward()
    model.zero_grad(set_to_none=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--log-every", type=int, default=50)
    for field, conv in SETTINGS_FLAGS.items():
        p.add_argument("--" + field.replace("_", "-"), dest=field, type=conv,
                       help=f"RuntimeSettings.{field} (default: from the environment)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    on = device()
    model, optimizer, scheduler = build(args.lr, on)
    prime(model)
    if is_standby():  # a warm spare: everything above is done; now wait for the ranks of a failed host
        log.info("standby: set up, waiting for an assignment")
        wait_for_assignment()  # the assignment's variables, as a cold start gets them
    overrides = {f: getattr(args, f) for f in SETTINGS_FLAGS if getattr(args, f) is not None}
    if "bind_host" not in overrides and os.environ.get("POD_IP"):
        overrides["bind_host"] = os.environ["POD_IP"]
    settings = RuntimeSettings.from_env(**overrides)
    settings = replace(settings, checkpoint_dir=job_checkpoints(settings.checkpoint_dir, settings.job_id))
    log.info("replica %s rank %d of %d (local rank %d) starts", settings.replica_id, settings.rank,
             settings.world_size, settings.local_rank)

    group = None
    if settings.world_size > 1:  # the replica's own ranks: gradients are averaged inside it first
        # Each restart of the replica meets only its own ranks (fthsdp/process_group.py): a spare's
        # standby may dial the rank-0 host while the old rank 0 there is still stopping. Within
        # 5 minutes (a restarted rank 0 imports torch first); a collective that waits longer fails.
        # A rank meets under its rank 0's replica version (in a first layout it may have been
        # given a newer one) and says so in its hello.
        backend = "nccl" if on.type == "cuda" else "gloo"
        met = init_replica_group(backend, settings.rank, settings.world_size, timedelta(minutes=5))
        if met:
            settings = replace(settings, replica_version=met)
        group = dist.group.WORLD
    manager = Manager(model, optimizer, settings, process_group=group)
    manager.register_state("scheduler", scheduler)  # travels with catch-up and checkpoints
    manager.register_rng()                          # so do the RNG streams
    manager.start()
    ft_optimizer = FaultTolerantOptimizer(manager, optimizer)
    rows = slice(settings.rank, None, settings.world_size)  # this rank's share of the batch
    # Each batch begins a step (its quorum; a catch-up first when this replica is behind). The
    # loop ends at max_steps, or when the job is COMPLETED. Errors the runtime cannot recover
    # from raise (RetryLimitExceeded after max_retries failed steps in a row): the process
    # exits non-zero and the controller restarts its replica; the replica is then not FINISHED.
    for x, y in manager.batches(batch_at):
        ft_optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows].to(on)), y[rows].to(on))
        loss.backward()
        # Averages gradients inside the replica and across replicas, votes, then commits
        # (True) or rolls back for a retry of the same batch (False).
        if ft_optimizer.step(loss):
            scheduler.step()  # registered state changes only after a commit
            if manager.step % args.log_every == 0:
                out = manager.last_outcome
                log.info("replica %s rank %d: step %d loss %.4f replicas %s lr_scale %.3f", settings.replica_id,
                         settings.rank, manager.step, loss.item(), ",".join(out.included), out.lr_scale)
    manager.close()  # the replica is FINISHED once every rank got here
    log.info("replica %s rank %d done at step %d", settings.replica_id, settings.rank, manager.step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
