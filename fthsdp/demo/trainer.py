"""One demo trainer process: the demo's workload through the real runtime, every step recorded.

    python -m fthsdp.demo.trainer CONFIG_JSON

The workload is an MLP on the digits, or (`"model": "gpt"`) a small transformer on text,
sharded with FSDP2 over the replica's ranks (fthsdp/demo/workloads.py). Started by an agent
(assignment in the FTHSDP_* environment, or handed to a standby on stdin, see `agent.env`) or
directly by the baseline run. Writes JSON lines to <records>/<replica>-<rank>-<pid>.jsonl:
"trained" before each all-reduce (the batch this replica computed), "catching_up" when a step
fetches the state of its source (named), "commit"/"retry" after each step (with the digests
of the state it trained from and of the state after it), "done" with the held-out score and
the state digest at the end. Semi-synchronous (FTHSDP_SYNC_MODE local_sgd, diloco or
streaming_diloco, which the runtime reads from the environment: the loop is the same),
"trained" comes per inner step (the sync it trains for, its position, its inner index) and
"commit" per committed sync, after a "retry" for each of its attempts that failed (with
"batches": K, the inner steps a sync commits: H, or H / F with streaming_diloco's F fragments;
the mean loss of its inner steps, and the digests of the
global state: the parameters, the outer optimizer and the ledger; the inner optimizer is each
replica's own).
Exits 0 when the job reached its steps in a full step (one every
configured replica contributed to, at or past the end, even if the end was read late), or when
its replica ended first (another of its ranks read the end a step earlier). Optional
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
from typing import Callable

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


#: how often a starting rank looks again for its ports or its leader (a spare's start waits on it)
PORT_POLL_S = 0.02


def _wait_for_ports(*ports: int | None, timeout_s: float = 20.0) -> None:
    """On one machine a spare takes over ports that the replaced host's trainers free only as
    they stop (the agent's grace): wait until this rank can listen on them (bounded)."""
    import socket

    deadline = time.monotonic() + timeout_s
    for port in (p for p in ports if p):
        while True:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return  # let the real bind report it
                    time.sleep(PORT_POLL_S)


def _claim_ports(records: Path, replica: str, host: str) -> None:
    """Rank 0 holds its replica's ports now: say so for the replica's other ranks (below)."""
    _write_atomic(records / f"{replica}.ports", json.dumps({"host": host, "pid": os.getpid()}))


def _wait_for_leader(records: Path, replica: str, host: str, timeout_s: float = 20.0) -> None:
    """A rank > 0 connects to its leader's ports (coordinator, gloo store), which on one machine
    the replaced host's leader may still hold while it stops: wait (bounded) until a live leader
    on this rank's own host has claimed them, so it never joins the old incarnation's group."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            owner = json.loads((records / f"{replica}.ports").read_text())
            if owner["host"] == host and _alive(int(owner["pid"])):
                return
        except (OSError, ValueError, KeyError):
            pass  # not claimed yet, or being replaced
        time.sleep(PORT_POLL_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's: alive
        pass
    return True


def _faulty(faults, host: str, rank: int, opt, step: Callable[[], int]):
    """The Seams (and optimizer) of a trainer on a host the demo made go bad: the fault's
    wrapper, let loose when its file appears (fthsdp/demo/faults.py); a rank that holds in a
    sync for a kill to land there (run.fault_specs: from the sync its file names on, `step()`
    being the step trained now) gets that wrapper too. Other trainers: as is."""
    import dataclasses

    from fthsdp.demo import faults as f

    mine = [x for x in faults if x["host"] == host and x["rank"] == rank]
    seams, opt = _diagnosed(next((x for x in mine if x["kind"] != "hold-in-sync"), None), opt)
    for hold in (x for x in mine if x["kind"] == "hold-in-sync"):
        go, held = Path(hold["go"]), Path(hold["held"])

        def armed(go=go, held=held) -> bool:  # once: a restarted trainer on this host finds `held`
            try:
                return not held.exists() and step() >= int(go.read_text())
            except (OSError, ValueError):  # not armed (yet)
                return False

        def holding(held=held) -> None:
            _write_atomic(held, json.dumps({"pid": os.getpid(), "t": time.time()}))
        seams = dataclasses.replace(seams, endpoint=lambda ep, inner=seams.endpoint, armed=armed, holding=holding,
                                    hold_s=hold["hold_s"]: f.HoldsInSync(inner(ep), armed, holding, hold_s))
    return seams, opt


def _diagnosed(mine, opt):
    from fthsdp import Seams
    from fthsdp.demo import faults as f

    if mine is None:
        return Seams(), opt
    go_file = Path(mine["go"])

    def go() -> bool:
        return go_file.exists()
    kind = mine["kind"]
    if kind == "hang":
        return Seams(sync=lambda sync: f.NeverJoins(sync, go)), opt
    if kind == "stall":
        return Seams(endpoint=lambda endpoint: f.StallsInside(endpoint, go)), opt
    if kind == "slow":
        return Seams(sync=lambda sync: f.Slow(sync, mine["extra_s"], go)), opt
    return Seams(), f.FlipsBits(opt, go)


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

    from fthsdp import Manager, RuntimeSettings
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
    host = os.environ.get(agent_env.HOST_ID, "")
    ports = cfg["ports"][host if cfg.get("ports_by") == "host" else rid]
    if rank == 0:  # a replaced host's trainers may still hold the replica's ports (one machine)
        _wait_for_ports(ports["leader"], ports["gloo"] if world > 1 else None)
        _claim_ports(records, rid, host)
    else:
        _wait_for_leader(records, rid, host)
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
        # where other replicas reach this rank's FTAR and state server: the host's own address
        # on a test network (tests/chaos/network.py), else loopback
        bind_host=cfg.get("bind_hosts", {}).get(host, "127.0.0.1"),
        quorum_timeout_s=t["quorum_s"], allreduce_timeout_s=t["allreduce_s"], gather_timeout_s=t["vote_s"],
        fetch_timeout_s=t["fetch_s"], fetch_hold_timeout_s=t["fetch_hold_s"],
        heartbeat_interval_s=t["heartbeat_s"],
        controller_heartbeat_timeout_s=t.get("controller_heartbeat_s", RuntimeSettings.controller_heartbeat_timeout_s),
        ftar_chunk_bytes=64 << 10,
        digest_every_steps=cfg.get("digest_every_steps", 100),
        checkpoint_dir=cfg.get("checkpoint_dir", ""), checkpoint_every_steps=cfg.get("checkpoint_every", 0))
    seams, opt = _faulty(cfg.get("faults", ()), host, rank, opt,
                         lambda: manager.plan.step if manager.plan is not None else manager.step)
    replicas = cfg["replicas"]
    manager = Manager(model, opt, settings, process_group=group, seams=seams).start()
    write(event="started", step=manager.step, incarnation=manager.incarnation, standby=standby,
          start_s=round(time.time() - assigned, 3))
    batches = manager.batches(w.batch_at)
    # Stop past `steps` once a step that every configured replica contributed to is committed at
    # or past the end: the end may become known a step late (the chaos run decides it from a
    # view that a controller failover left stale), and once the others finished no later step
    # is ever full again -- so a full step at the end, even if seen late, ends this replica too.
    # Semi-synchronous (FTHSDP_SYNC_MODE): the same loop; a step of the protocol is a sync, and
    # the K inner steps before it each train a batch (end_step of the K-th syncs): K = H, or
    # H / F with streaming_diloco's F fragments (a sync of one fragment every K inner steps).
    semi, k = settings.semi_synchronous, settings.inner_steps_per_sync
    full_step = -1  # the last step committed with every replica included
    began, before, losses = 0.0, "", []  # of the step (semi-synchronous: of the round of K inner steps)
    while not (manager.step >= _steps(cfg) and full_step + 1 >= _steps(cfg)) and manager.step < cfg["max_steps"]:
        started = time.time()
        try:
            x, y = next(batches)  # begins the step: quorum, plan, catch-up when behind (or an inner step)
        except StopIteration:  # the replica ended first: another rank read the end step a step earlier
            break
        step, position = manager.step, batches.last_position
        inner = position - manager.ledger.position(rid) if semi else 0
        if inner == 0:  # the state this step (round) trains from: the global state when semi-synchronous
            began, before, losses = started, "" if manager.is_behind and not semi else manager.digest(), []
        if manager.is_behind and not semi:  # fetching from its source while it computes (and contributes zeros)
            write(event="catching_up", step=manager.plan.step, quorum_id=manager.plan.quorum_id,
                  source=manager.plan.source_replica)
        opt.zero_grad(set_to_none=True)
        computing = time.time()
        rows = slice(rank, None, world)
        loss = w.loss(x[rows], y[rows])
        plan = manager.plan
        if semi:  # whether the round counts is decided at its sync
            write(event="trained", step=step, position=position, inner=inner)
        elif plan is not None and not plan.behind:  # before backward: a sharded model all-reduces inside it
            write(event="trained", step=plan.step, quorum_id=plan.quorum_id, position=position)
        loss.backward()
        pace = cfg["min_step_s"] - (time.time() - computing)  # stands in for accelerator time
        if pace > 0:
            time.sleep(pace)
        losses.append(loss.item())
        committed = manager.end_step(loss.item(), tokens=len(x))  # averages (or syncs), votes, commits
        if semi and manager.step == step:
            continue  # an inner step (or the replica ended)
        o = manager.last_outcome
        if committed and len(o.included) == len(replicas):
            full_step = o.step
        counted = {"batches": k} if semi else {"position": position}
        # a sync's attempts all concluded inside this end_step (an overlapped one's maybe during
        # its inner steps): a "retry" row for each that failed, then the sync's row
        attempts = manager.take_outcomes()
        for a in attempts if semi and attempts else [o]:
            write(event="commit" if a.committed else "retry", began=began, step=a.step, quorum_id=a.quorum_id,
                  behind=a.behind, included=list(a.included), positions_before=a.positions_before, **counted,
                  loss=sum(losses) / len(losses), lr_scale=a.lr_scale, reason=a.reason,
                  before="" if a.behind else before, digest=manager.digest())
    # streaming_diloco: between fragment syncs the model holds this replica's own inner steps;
    # close() gives it the global copy of every fragment, the job's result, which is what is judged
    streaming = settings.sync_mode == "streaming_diloco"
    if streaming:
        manager.close()
    test_loss, test_acc = w.evaluate()  # every rank: a sharded model's forward is collective
    write(event="done", step=manager.step, test_loss=test_loss, test_acc=test_acc, params=param_hash(model),
          digest=manager.digest())
    _write_atomic(records / f"{rid}-{rank}.done", str(manager.step))
    if not streaming:
        manager.close()
    out.close()
    if group is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
