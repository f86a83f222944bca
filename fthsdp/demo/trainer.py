"""One demo trainer process: the demo's workload through the real runtime, every step recorded.

    python -m fthsdp.demo.trainer CONFIG_JSON

The workload is an MLP on the digits, or (`"model": "gpt"`) a small transformer on text,
sharded with FSDP2 over the replica's ranks (fthsdp/demo/workloads.py). Started by an agent
(assignment in the FTHSDP_* environment, or handed to a standby on stdin, see `agent.env`) or
directly by the baseline run. Writes JSON lines to <records>/<replica>-<rank>-<pid>.jsonl:
"trained" before each all-reduce (the batch this replica computed), "catching_up" when a step
fetches the state of its source (named), "commit"/"retry" after each step (with the digests
of the state it trained from and of the state after it), "done" with the held-out score and
the state digest at the end. Exits 0 when the job reached its steps in a full step. Optional
config keys: "checkpoint_dir" and "checkpoint_every" (durable checkpoints), "ports_by": "host"
(the coordinator and gloo ports are the host's, not the replica's: a replica moved to another
host never finds its old ports held by a frozen trainer), "steps_file" (the number of steps
is read from this file at every step, and there is no end while it is missing: whoever runs
the job decides when it ends).
Forward + backward take at least `min_step_s` (the rest is slept, standing in for
accelerator time), so recovery on two CPU cores is measured against a realistic step rate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from agent import env as agent_env


def param_hash(model) -> str:
    """A hash of this rank's parameters (its shards, when the model is sharded)."""
    from fthsdp.state.shards import local

    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(local(p).contiguous().numpy().tobytes())
    return h.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _steps(cfg: dict) -> float:
    if not cfg.get("steps_file"):
        return cfg["steps"]
    try:
        return int(Path(cfg["steps_file"]).read_text())
    except (FileNotFoundError, ValueError):  # not decided yet (or being written)
        return float("inf")


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    import torch
    import torch.distributed as dist

    from fthsdp import Manager, RuntimeSettings, state_digest
    from fthsdp.demo.workloads import build_mlp

    torch.set_num_threads(1)
    # Pre-initialize before reporting in: torch.optim's first use imports torch._dynamo (seconds).
    torch.optim.SGD(build_mlp(4).parameters(), lr=0.1, momentum=0.9)
    if cfg.get("model") == "gpt":
        import torch.distributed.fsdp  # noqa: F401 - FSDP2's imports, before reporting in too
    standby = os.environ.get(agent_env.STANDBY) == "1"
    if standby:  # warm spare: imports and data are done
        try:
            agent_env.wait_for_assignment()
        except EOFError:
            return 0
    assigned = time.time()
    rid, rank = os.environ[agent_env.REPLICA_ID], int(os.environ[agent_env.RANK])
    world = int(os.environ[agent_env.WORLD_SIZE])
    controller = os.environ[agent_env.CONTROLLER]  # every controller address, in HA order
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s trainer {rid}/{rank} %(levelname)s %(message)s")
    records = Path(cfg["records"])
    out = open(records / f"{rid}-{rank}-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115 - whole life

    def write(**fields) -> None:
        out.write(json.dumps({"t": time.time(), "replica": rid, "rank": rank, "pid": os.getpid(),
                              **fields}) + "\n")

    _write_atomic(records / f"{rid}-{rank}.pid", str(os.getpid()))
    ports = cfg["ports"][os.environ[agent_env.HOST_ID] if cfg.get("ports_by") == "host" else rid]
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports['gloo']}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=20))
        group = dist.group.WORLD
    from fthsdp.demo.workloads import workload

    w = workload(cfg, world)
    model, opt = w.model, w.optimizer
    t = cfg["timeouts"]
    settings = RuntimeSettings.from_env(
        job_id=cfg["job_id"], replica_id=rid, rank=rank, world_size=world, controller_address=controller,
        coordinator_address=f"127.0.0.1:{ports['leader']}", max_retries=30,
        quorum_timeout_s=t["quorum_s"], allreduce_timeout_s=t["allreduce_s"], gather_timeout_s=t["vote_s"],
        fetch_timeout_s=t["fetch_s"], fetch_hold_timeout_s=t["fetch_hold_s"],
        heartbeat_interval_s=t["heartbeat_s"], ftar_chunk_bytes=64 << 10,
        checkpoint_dir=cfg.get("checkpoint_dir", ""), checkpoint_every_steps=cfg.get("checkpoint_every", 0))
    replicas = cfg["replicas"]
    manager = Manager(model, opt, settings, process_group=group).start()
    write(event="started", step=manager.step, incarnation=manager.incarnation, standby=standby,
          start_s=round(time.time() - assigned, 3))
    batches = manager.batches(w.batch_at)
    full = False  # stop past `steps` in a step that every configured replica contributed to
    while not (manager.step >= _steps(cfg) and full) and manager.step < cfg["max_steps"]:
        began = time.time()
        x, y = next(batches)  # begins the step: quorum, plan, catch-up when behind
        position = batches.last_position
        before = "" if manager.is_behind else state_digest(model, opt, manager.ledger.to_json(), manager.step)
        if manager.is_behind:  # fetching from its source while it computes (and contributes zeros)
            write(event="catching_up", step=manager.plan.step, quorum_id=manager.plan.quorum_id,
                  source=manager.plan.source_replica)
        opt.zero_grad(set_to_none=True)
        computing = time.time()
        rows = slice(rank, None, world)
        loss = w.loss(x[rows], y[rows])
        plan = manager.plan
        if plan is not None and not plan.behind:  # before backward: a sharded model all-reduces inside it
            write(event="trained", step=plan.step, quorum_id=plan.quorum_id, position=position)
        loss.backward()
        pace = cfg["min_step_s"] - (time.time() - computing)  # stands in for accelerator time
        if pace > 0:
            time.sleep(pace)
        manager.sync_gradients(loss.item())
        committed = manager.end_step(loss.item(), tokens=len(x))
        o = manager.last_outcome
        full = committed and len(o.included) == len(replicas)
        write(event="commit" if committed else "retry", began=began, step=o.step, quorum_id=o.quorum_id,
              behind=o.behind, included=list(o.included), positions_before=o.positions_before, position=position,
              loss=loss.item(), lr_scale=o.lr_scale, reason=o.reason, before=before,
              digest=state_digest(model, opt, manager.ledger.to_json(), manager.step))
    test_loss, test_acc = w.evaluate()  # every rank: a sharded model's forward is collective
    write(event="done", step=manager.step, test_loss=test_loss, test_acc=test_acc, params=param_hash(model),
          digest=state_digest(model, opt, manager.ledger.to_json(), manager.step))
    _write_atomic(records / f"{rid}-{rank}.done", str(manager.step))
    manager.close()
    out.close()
    if group is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
