"""One trainer process for the cluster tests: a tiny model on fixed data, recording every step.

Run as `python -m tests.runtime.train_worker CONFIG_JSON`. Writes JSON lines to
config["record"]: one per step attempt (committed or not) with the state digests (before: the
state it trained from, empty for a catch-up; digest: the state after it),
the ledger positions the step read, and what this replica trained. With "stateful", the
model has dropout and the script registers a StepLR schedule, a sampler whose epoch moves
on commits, and the RNG streams: the digest covers them, and the record shows each. With
"fsdp", the model is wrapped with FSDP2's fully_shard over the replica's ranks (each rank
holds its shard; digests are per shard); with "cuda" it lives on GPU 0 (every replica shares
it) and the replica's ranks talk over NCCL. With "dump", the last state (this rank's local
tensors) is saved next to the record (tests/runtime/hsdp_reference.py writes the same).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, Seams, ddp_comm_hook, state_digest
from fthsdp.state.shards import local
from tests.runtime.faults import FailingSync, HiddenAtStart, KillWhenAllreduceStarts

BATCH_ROWS = 8


def batch_at(replica_id: str, position: int, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica `replica_id`'s batch number `position`: fixed data, a function of these only."""
    g = torch.Generator().manual_seed(int(replica_id) * 100_003 + position + epoch * 7_919)
    x = torch.randn(BATCH_ROWS, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5


class EpochSampler:
    """A stateful sampler: which data a position reads depends on the epoch, which the script
    moves on every `per_epoch` committed steps (registered state: replicated, changed between steps)."""

    def __init__(self, per_epoch: int) -> None:
        self.per_epoch, self.epoch = per_epoch, 0

    def after_commit(self, step: int) -> None:
        if step % self.per_epoch == 0:
            self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "per_epoch": self.per_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.per_epoch = state["epoch"], state["per_epoch"]


def build_model(stateful: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.Tanh()] + ([torch.nn.Dropout(0.25)] if stateful else [])
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 1))


def shard_model(model: torch.nn.Module, mesh) -> None:
    """FSDP2: one parameter group per Linear, then the root (the reference shards alike)."""
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def local_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This rank's local pieces of the parameters and of the optimizer's tensors."""
    out = {f"model/{k}": local(v).clone() for k, v in model.state_dict().items()}
    for idx, per_param in opt.state_dict()["state"].items():
        out.update({f"optim/{idx}/{k}": local(v).clone() for k, v in per_param.items()})
    return out


def rng_digest() -> str:
    """A hash of the torch, numpy and Python RNG states right now."""
    h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    h.update(np.random.get_state()[1].tobytes())
    h.update(repr(random.getstate()).encode())
    return h.hexdigest()[:16]


def record_writer(cfg: dict):
    """Logging set up for this rank, and `write(**fields)`: one row of config["record"], stamped
    with the time, the replica, the rank and the incarnation."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s r{cfg['replica_id']}/{cfg['rank']} %(name)s: %(message)s")
    record = open(cfg["record"], "a", buffering=1)

    def write(**fields) -> None:
        record.write(json.dumps({"t": time.time(), "replica": cfg["replica_id"], "rank": cfg["rank"],
                                 "incarnation": cfg["incarnation"], **fields}) + "\n")
    return write


def main(cfg: dict) -> int:
    write = record_writer(cfg)

    # Faults apply to this process's first incarnation only; they wrap real parts (tests/runtime/faults.py).
    faults = [f for f in cfg.get("faults", []) if f["replica"] == cfg["replica_id"] and cfg["incarnation"] == 0
              and f.get("rank", 0) in (None, cfg["rank"])]  # rank None: every rank
    kill_at = {f["step"] for f in faults if f["kind"] in ("kill", "sigkill")}
    kill = (lambda: os.kill(os.getpid(), signal.SIGKILL)) if any(f["kind"] == "sigkill" for f in faults) else None
    abort_at = {f["step"] for f in faults if f["kind"] == "abort"}
    corrupt_after = {f["step"] for f in faults if f["kind"] == "corrupt"}
    kill_source = any(f["kind"] == "kill_source" for f in faults)

    def killing_now() -> bool:
        plan = manager.plan
        return plan is not None and (plan.step in kill_at or (kill_source and bool(plan.fetchers)))

    seams = Seams(
        endpoint=lambda ep: KillWhenAllreduceStarts(ep, killing_now,
                                                    lambda: write(event="killed", step=manager.plan.step), kill),
        sync=lambda sync: FailingSync(sync, lambda plan: "injected abort" if plan and plan.step in abort_at else None),
        checkpoints=HiddenAtStart if any(f["kind"] == "fresh_start" for f in faults) else (lambda store: store))

    world = cfg["world_size"]
    group = None
    device = torch.device("cuda", 0) if cfg.get("cuda") else torch.device("cpu")  # replicas share one GPU
    if world > 1 or cfg.get("ddp") or cfg.get("cuda"):  # on a GPU: NCCL inside the replica, even of one rank
        if cfg.get("cuda"):
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cfg.get("cuda") else "gloo", init_method=f"tcp://127.0.0.1:{cfg['gloo_port']}",
                                rank=cfg["rank"], world_size=world, timeout=timedelta(seconds=20))
        group = dist.group.WORLD
    stateful = cfg.get("stateful", False)
    dtype = getattr(torch, cfg.get("dtype", "float32"))  # bfloat16: 16-bit parameters and gradients
    model = build_model(stateful).to(device, dtype)
    if cfg.get("fsdp"):
        shard_model(model, init_device_mesh(device.type, (world,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    settings = RuntimeSettings.from_env(
        job_id="t", replica_id=cfg["replica_id"], rank=cfg["rank"], world_size=world,
        controller_address=cfg["controller"], coordinator_address=cfg["coordinator_address"], max_retries=4,
        apply_lr_scale=cfg.get("apply_lr_scale", True), quorum_timeout_s=30.0, allreduce_timeout_s=10.0,
        gather_timeout_s=15.0, fetch_timeout_s=10.0, fetch_hold_timeout_s=5.0, heartbeat_interval_s=0.5,
        checkpoint_dir=cfg.get("checkpoint_dir", ""), checkpoint_every_steps=cfg.get("checkpoint_every", 0),
        digest_every_steps=cfg.get("digest_every", 100), ftar_chunk_bytes=64 << 10,
        copy_state_to_serve=cfg.get("copy_state_to_serve", False), relay_fanout=cfg.get("relay_fanout", 0))
    def pre_init() -> None:
        write(event="pre_init")
        print("ready", flush=True)  # the cluster answers "go" once every first-incarnation worker is ready
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("no go from the cluster")

    manager = Manager(model, opt, settings, process_group=group, pre_init=pre_init, seams=seams)
    sched, sampler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7), EpochSampler(3)
    if stateful:
        manager.register_state("sched", sched)
        manager.register_state("sampler", sampler)
        manager.register_rng(seed=11)
    manager.start()
    write(event="started", step=manager.step, relay=manager.client.relay_address)  # "": talks to the coordinator
    forward = model
    if cfg.get("ddp"):  # DDP users: the comm hook replaces DDP's all-reduce
        forward = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        forward.register_comm_hook(manager, ddp_comm_hook)
    ft_opt = FaultTolerantOptimizer(manager, opt)
    batches = manager.batches(lambda r, p: batch_at(r, p, sampler.epoch))
    full = False  # stop once past `steps` in a step every configured replica contributed to
    commits, most = 0, cfg.get("commits", float("inf"))  # ... or after `commits` commits of this process

    def digest() -> str:
        return state_digest(model, opt, manager.ledger.to_json(), manager.step, manager.registry.state_dicts())

    while not (manager.step >= cfg["steps"] and full) and manager.step < cfg["max_steps"] and commits < most:
        x, y = next(batches)
        position = batches.last_position
        before = "" if manager.is_behind else digest()  # the state this step trains from
        ft_opt.zero_grad()
        plan = manager.plan
        rows = slice(cfg["rank"], None, world)
        loss = torch.nn.functional.mse_loss(forward(x[rows].to(device, dtype)), y[rows].to(device, dtype))
        loss.backward()
        committed = ft_opt.step(loss)
        if committed and stateful:
            sched.step()
            sampler.after_commit(manager.step)
        if committed and manager.last_outcome.step in corrupt_after:
            with torch.no_grad():  # a flipped weight nobody reports
                next(model.parameters()).view(-1)[0] += 1e-3
            write(event="corrupted", step=manager.last_outcome.step)
        out = manager.last_outcome
        commits += committed
        full = committed and len(out.included) == cfg["replicas"]
        stop = committed and out.step == cfg.get("stop_after")
        write(event="commit" if committed else "retry", step=out.step, quorum_id=out.quorum_id,
              behind=out.behind, included=list(out.included), positions_before=out.positions_before,
              trained_position=position, position=position, lr=opt.param_groups[0]["lr"], lr_scale=out.lr_scale,
              reason=out.reason, ckpt_error=manager.last_checkpoint_error, sched=sched.state_dict(),
              source=plan.source_replica if plan is not None else "", fetched_bytes=manager.last_catch_up_bytes,
              epoch=sampler.epoch, rng=rng_digest(), before=before, digest=digest())
        if stop:  # the cluster SIGKILLs the whole job once every worker got here
            write(event="stopped", step=out.step)
            sys.stdin.readline()
            raise SystemExit("the cluster should have killed this worker")
    write(event="done", step=manager.step)
    if cfg.get("dump"):
        torch.save(local_state(model, opt), cfg["record"].removesuffix(".jsonl") + ".pt")
    manager.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
