"""Train a small GPT with FSDP2 inside each replica and fault-tolerant HSDP across replicas.

Each replica is a group of ranks (one process each) that shards the model with FSDP2
(`fully_shard`, Gloo on CPU, NCCL on GPU); fthsdp all-reduces every reduce-scatter output
across replicas over FTAR, rank k with rank k of the other replicas, and keeps training when
a replica dies: the dead one restarts and catches up from the live ones, shard by shard.

One replica of 2 ranks, launched by torchrun (MASTER_ADDR:MASTER_PORT+1 is the coordinator,
so replicas on one machine need master ports at least 2 apart; job-secret is the controller's
--job-secret-file):

    FTHSDP_CONTROLLER=127.0.0.1:50051 FTHSDP_REPLICA_ID=r0 FTHSDP_JOB_SECRET_FILE=job-secret \\
        torchrun --nproc-per-node 2 --master-port 29500 --max-restarts 3 examples/train_gpt.py --steps 200

`--max-restarts` lets torchrun restart the replica's ranks when one dies (without it a killed
rank's replica stays dead): the restarted ranks rejoin as a new incarnation and catch up from
the live replicas (fthsdp.process_group keeps each attempt's rendezvous apart).

Replicas that meet every H steps instead (DiLoCo; the controller runs with --sync-mode diloco
--sync-every 8) is configuration, not code: the same command with

    FTHSDP_SYNC_MODE=diloco FTHSDP_SYNC_EVERY_STEPS=8

trains 8 inner steps on the replica's own ranks between two syncs of the pseudo-gradient;
--steps still counts training steps (ceil(steps / 8) syncs).

or as the command of an agent (`fthsdp agent ... -- python examples/train_gpt.py --steps 200`):
the agent sets FTHSDP_REPLICA_ID, FTHSDP_RANK, FTHSDP_WORLD_SIZE and FTHSDP_CONTROLLER; rank 0's
host and a free port pair come from MASTER_ADDR and MASTER_PORT, as under torchrun. Start as
many replicas (distinct FTHSDP_REPLICA_IDs) as the controller's --replicas. The text is Python's
own documentation (`pydoc_data`), so nothing is downloaded.

Exit status: 0 once trained (the replica finished); 3 when this process started, or torchrun
restarted it, after the job had COMPLETED (JobAlreadyCompleted: nothing trained, nothing
written); 78 for a configuration error that no restart can fix (ConfigurationError: no job
secret, a job secret that differs from the controller's, a replica id or job id the controller
refuses): fix it instead of restarting (torchrun restarts every non-zero exit up to
--max-restarts, so a wrong secret fails the same way each time and then ends torchrun); non-zero
with the runtime's error otherwise (a Fatal error, e.g. JobFailed when the job FAILED).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import zlib
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from fthsdp import (EXIT_JOB_ALREADY_COMPLETED, ConfigurationError, FaultTolerantOptimizer, JobAlreadyCompleted,
                    Manager, RuntimeSettings, exit_status)
from fthsdp.settings import ENV_CHECKPOINT_DIR
from fthsdp.process_group import init_replica_group
from fthsdp.demo.gpt import Corpus, GptConfig, TinyGPT, evaluate, parameter_count, shard

#: Where checkpoints go unless told: CHECKPOINT_ROOT/<job id>, in the working directory.
CHECKPOINT_ROOT = "fthsdp-checkpoints"
#: How often by default: with the default model one checkpoint costs about 1.3 steps (2 ranks on
#: CPU: 1.0 s a step, 2.3 s a step with a checkpoint after every one), so every 200 steps costs
#: under 1% of the training time.
CHECKPOINT_EVERY_STEPS = 200

def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="train this many steps, then finish")
    p.add_argument("--rows", type=int, default=8, help="sequences per replica and step")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir",
                   help=f"sharded DCP checkpoints go here, the same for every replica (resumed at start; default: "
                        f"{ENV_CHECKPOINT_DIR}, else {CHECKPOINT_ROOT}/JOB_ID in the working directory; '' for none)")
    p.add_argument("--checkpoint-every", type=int,
                   help=f"write a checkpoint after every N-th committed step (default: {CHECKPOINT_EVERY_STEPS}, "
                        f"or --steps when fewer: a run shorter than that checkpoints once, at its end; 0 for none)")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even when CUDA is there")
    p.add_argument("--out", type=Path, help="write <out>/<replica>-<rank>.json at the end (for tests)")
    args = p.parse_args(argv)
    if args.checkpoint_every is not None and args.checkpoint_every < 0:
        p.error(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.steps < 1 or args.rows < 1 or args.lr <= 0 or args.warmup_steps < 0:
        p.error(f"--steps, --rows and --lr must be > 0 and --warmup-steps >= 0, got {args.steps}, {args.rows}, "
                f"{args.lr} and {args.warmup_steps}")
    return args


def checkpointing(settings: RuntimeSettings, directory: str | None, every: int | None, steps: int) -> RuntimeSettings:
    """Safe by default: checkpoints beside the run unless told otherwise, every
    CHECKPOINT_EVERY_STEPS committed steps (or once, at the end, when the run is shorter)."""
    if directory is None:  # not given: FTHSDP_CHECKPOINT_DIR (from_env read it), else beside the run
        directory = settings.checkpoint_dir or str(Path(CHECKPOINT_ROOT) / settings.job_id)
    if every is None:
        every = min(CHECKPOINT_EVERY_STEPS, steps)
    return replace(settings, checkpoint_dir=directory, checkpoint_every_steps=every if directory else 0).validate()


def main(argv: list[str]) -> int:
    args = _args(argv)
    settings = RuntimeSettings.from_env()
    # --steps counts training steps; semi-synchronous (FTHSDP_SYNC_MODE), a step of the protocol
    # (max_steps, checkpoint periods, manager.step) is a sync of sync_every_steps of them
    syncs = -(-args.steps // settings.sync_every_steps)
    settings = checkpointing(replace(settings, max_steps=syncs), args.checkpoint_dir, args.checkpoint_every, syncs)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {settings.replica_id}/{settings.rank} %(message)s")
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", settings.local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    group = None
    if settings.world_size > 1 or cuda:  # the replica's own ranks: FSDP2 shards over them
        # Only this restart's ranks meet: under torchrun --max-restarts this attempt's, under an
        # agent this replica version's (a rank takes its rank 0's version, and says so in its hello).
        met = init_replica_group("nccl" if cuda else "gloo", settings.rank, settings.world_size, timedelta(seconds=60))
        if met:
            settings = replace(settings, replica_version=met)
        group = dist.group.WORLD

    torch.manual_seed(args.seed)  # every replica starts from the same weights
    config = GptConfig(layers=args.layers, d_model=args.d_model, seq_len=args.seq_len)
    model = TinyGPT(config).to(device)
    n_params = parameter_count(model)
    if group is not None:
        shard(model, init_device_mesh(device.type, (settings.world_size,)))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # warm-up then cosine decay; registered, so it travels with catch-up and checkpoints
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (args.warmup_steps + 1)) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))

    manager = Manager(model, opt, settings, process_group=group)
    manager.register_state("schedule", schedule)
    manager.start()
    corpus = Corpus.load()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    rows = slice(settings.rank, None, settings.world_size)  # each rank its share of the replica's batch
    if settings.rank == 0:
        logging.info("%d parameters, %s, %d rank(s) per replica, starting at step %d; %s", n_params, device,
                     settings.world_size, manager.step,
                     f"checkpoints every {settings.checkpoint_every_steps} steps in {settings.checkpoint_dir}"
                     if settings.checkpoint_every_steps else "NO durable checkpoint: a failure of every replica "
                                                             "restarts from step 0")

    def batch_at(replica_id: str, position: int):
        stream = zlib.crc32(replica_id.encode())  # each replica reads its own stream, exactly once
        return corpus.batch(stream, position, args.rows * settings.world_size, config.seq_len, args.seed)

    committed = []
    try:
        for x, y in manager.batches(batch_at):  # JobAlreadyCompleted: it started after the job COMPLETED
            step = manager.step
            ft_opt.zero_grad()
            loss = model.loss(x[rows].to(device), y[rows].to(device))
            loss.backward()
            if ft_opt.step(loss, tokens=x.numel()):  # semi-synchronous: an inner step, the H-th with its sync
                schedule.step()  # registered state changes only between steps, after a commit
                if manager.step != step:  # a step of the protocol committed
                    committed.append(step)
                    if settings.rank == 0 and manager.step % 20 == 0:
                        logging.info("step %d loss %.3f lr %.2e", manager.step, loss.item(),
                                     opt.param_groups[0]["lr"])
    except JobAlreadyCompleted as exc:  # started after the job ended: nothing trained, nothing written
        logging.error("%s", exc)
        return EXIT_JOB_ALREADY_COMPLETED
    held_out_loss, accuracy = evaluate(model, corpus)  # every rank: a sharded forward is collective
    if settings.rank == 0:
        # manager.step is the next step to train: the last one trained is the one before (the
        # controller's "finished after step N" names the same)
        logging.info("finished after step %d: held-out loss %.3f, next-byte accuracy %.3f", manager.step - 1,
                     held_out_loss, accuracy)
    if args.out is not None:
        (args.out / f"{settings.replica_id}-{settings.rank}.json").write_text(json.dumps({
            "replica": settings.replica_id, "rank": settings.rank, "step": manager.step, "committed": committed,
            "held_out_loss": held_out_loss, "accuracy": accuracy, "parameters": n_params,
            "digest": manager.digest()}))  # semi-synchronous: the global state (not the inner optimizer)
    manager.close()
    if group is not None:
        dist.destroy_process_group()
    return 0


def run(argv: list[str]) -> int:
    """main, with the exit status of a configuration error (78: do not restart on it)."""
    try:
        return main(argv)
    except ConfigurationError as exc:
        logging.basicConfig(level=logging.INFO)
        logging.error("configuration error (exit status %d; a restart cannot fix it): %s", exit_status(exc), exc)
        return exit_status(exc)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
