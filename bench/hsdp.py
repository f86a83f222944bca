"""HSDP under fthsdp against PyTorch's own HSDP: memory per rank, step time, sharded catch-up.

    python -m bench.hsdp --json

2 replicas x 2 ranks on this machine's CPUs (Gloo), one process per rank, a ~20M-parameter
decoder-only transformer (fthsdp/demo/gpt.py; --layers/--d-model change it). Every process
holds the model twice and trains both, step by step in alternation (so background load hits
both alike):
- torch: `fully_shard` on a 2-D mesh (replicate x shard) -- PyTorch's HSDP, no fault tolerance;
- ft: `fully_shard` on the replica's own ranks, a Manager per rank (a controller from the CLI,
  quorum, FTAR across replicas on each group's gradient shard from the all-reduce hook, vote,
  commit).
Reported (one JSON line): state_bytes_per_rank_fsdp (parameters + AdamW state this rank
really holds, from storage sizes) and state_bytes_per_rank_replicated (the same unsharded);
median step times (the slowest rank's per step) and overhead_pct = (ft - torch) / torch;
catchup_shard_gbs: rank k of replica 1 fetches rank k of replica 0's shards (its snapshot, over
loopback HTTP, checksum verified), both ranks at once: shard bytes / seconds / 1e9 (the slower),
in the best of --catchup-repeats such fetches (each started by both ranks together, as
bench.overhead takes the best of its catch-ups);
catchup_replica_gbs: both ranks' bytes over the slower one's time (the replica's catch-up);
tcp_one_stream_gbs: one loopback TCP stream (bench/limits.py), the best of a measurement just
before the workers start and one just after they end; catchup_shard_of_limit =
catchup_replica_gbs / tcp_one_stream_gbs: the two ranks fetch at once on this machine's cores,
which one stream already keeps busy (its sender and its receiver), so together they have what
one stream has (on real hosts each rank has its own).

One JSON line (FIELDS): replicas, ranks_per_replica, params, steps, the two state sizes,
step_ms_torch_hsdp, step_ms_ft_hsdp, overhead_pct, catchup_shard_bytes, catchup_shard_gbs,
catchup_repeats, catchup_replica_gbs, tcp_one_stream_gbs, catchup_shard_of_limit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench.common import free_port, secret_file
from controller.launch import launch
from protos import job_secret

REPO = Path(__file__).resolve().parents[1]
REPLICAS, RANKS = 2, 2
#: the fields of the JSON line (`python -m bench.hsdp --json`) and their types
FIELDS = {"replicas": int, "ranks_per_replica": int, "params": int, "steps": int, "state_bytes_per_rank_fsdp": int,
          "state_bytes_per_rank_replicated": int, "step_ms_torch_hsdp": float, "step_ms_ft_hsdp": float,
          "overhead_pct": float, "catchup_shard_bytes": int, "catchup_shard_gbs": float, "catchup_repeats": int,
          "catchup_replica_gbs": float, "tcp_one_stream_gbs": float, "catchup_shard_of_limit": float}


def _held_bytes(model, opt) -> int:
    from fthsdp.state.shards import storage_bytes

    tensors = list(model.parameters()) + [t for per in opt.state.values() for t in per.values()
                                          if hasattr(t, "untyped_storage")]
    return sum(storage_bytes(t) for t in tensors)


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
    from fthsdp.demo.gpt import Corpus, GptConfig, TinyGPT, parameter_count, shard
    from fthsdp.state import snapshot
    from fthsdp.state.fetch import fetch_once
    from fthsdp.state.registry import StateRegistry
    from fthsdp.state.serve import StateServer
    from fthsdp.state.stream import StateTarget

    torch.set_num_threads(1)
    g = args.rank
    replica, rank = divmod(g, RANKS)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.gloo_port}", rank=g,
                            world_size=REPLICAS * RANKS, timeout=timedelta(seconds=300))
    mesh = init_device_mesh("cpu", (REPLICAS, RANKS), mesh_dim_names=("replicate", "shard"))
    config = GptConfig(layers=args.layers, d_model=args.d_model, heads=args.heads, seq_len=args.seq_len)

    def built():
        torch.manual_seed(0)
        return TinyGPT(config)

    n_params = parameter_count(built())
    theirs = shard(built(), mesh)             # PyTorch's HSDP
    ours = shard(built(), mesh["shard"])      # FSDP2 inside the replica; FTAR across
    their_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-4)
    our_opt = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    coordinators = args.coordinators.split(",")
    manager = Manager(ours, our_opt, RuntimeSettings(
        job_id="bench", replica_id=str(replica), rank=rank, world_size=RANKS, controller_address=args.controller,
        coordinator_address=coordinators[replica], apply_lr_scale=False, allreduce_timeout_s=300.0,
        quorum_timeout_s=300.0, gather_timeout_s=300.0, ftar_chunk_bytes=4 << 20,
        job_secret=job_secret.from_env()),
        process_group=mesh["shard"].get_group()).start()
    ft_opt = FaultTolerantOptimizer(manager, our_opt)
    corpus = Corpus.load()

    def batch(position: int):
        x, y = corpus.batch(replica, position, args.rows * RANKS, config.seq_len, 0)
        return x[rank::RANKS], y[rank::RANKS]

    def torch_step(position: int) -> None:
        their_opt.zero_grad()
        theirs.loss(*batch(position)).backward()
        their_opt.step()

    batches = manager.batches(lambda _replica, position: batch(position))

    def ft_step() -> None:
        x, y = next(batches)
        ft_opt.zero_grad()
        loss = ours.loss(x, y)
        loss.backward()
        if not ft_opt.step(loss):
            raise RuntimeError(f"step failed without injected faults: {manager.last_outcome}")

    torch_times, ft_times = [], []
    for i in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        torch_step(i)
        t1 = time.perf_counter()
        ft_step()
        t2 = time.perf_counter()
        if i >= args.warmup:
            torch_times.append(t1 - t0)
            ft_times.append(t2 - t1)
    held = _held_bytes(ours, our_opt)
    step = manager.step
    manager.close()

    # Sharded catch-up: rank k of replica 1 fetches rank k of replica 0's shards.
    server = None
    key = job_secret.from_env().key(job_secret.PURPOSE_STATE)
    if replica == 0:
        held_snapshot = snapshot.take(step, "{}", ours, our_opt, StateRegistry())
        server = StateServer("127.0.0.1", 0, held_snapshot.served, f"bench-{g}", key=key).start()
        server.serve(step, ("bench",))
    addresses: list = [None] * (REPLICAS * RANKS)
    dist.all_gather_object(addresses, server.address if server else "")
    fetch: dict = {}
    target = StateTarget(ours, our_opt) if replica == 1 else None
    for _ in range(args.catchup_repeats):
        dist.barrier()  # both ranks of replica 1 start each fetch together
        if target is not None:
            t0 = time.perf_counter()
            fetched = fetch_once(addresses[rank], step, "bench", target.fresh, 300.0, key=key)
            fetch.setdefault("seconds", []).append(time.perf_counter() - t0)
            fetch["bytes"] = fetched.manifest.total_bytes
    dist.barrier()
    if server is not None:
        server.close()
    print(json.dumps({"rank": g, "torch": torch_times, "ft": ft_times, "held_bytes": held, "params": n_params,
                      "fetch": fetch}), flush=True)
    dist.destroy_process_group()


def _replicated_bytes(args: argparse.Namespace) -> int:
    """Parameters + AdamW state of the unsharded model (what every rank holds without FSDP)."""
    import torch

    from fthsdp.demo.gpt import GptConfig, TinyGPT

    model = TinyGPT(GptConfig(layers=args.layers, d_model=args.d_model, heads=args.heads, seq_len=args.seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.loss(torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 2, dtype=torch.int64)).backward()
    opt.step()
    return _held_bytes(model, opt)


def measure(args: argparse.Namespace) -> dict:
    from bench.limits import measure_tcp

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    limits = [measure_tcp(1, 256 << 20, 2)]
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-") as tmp:  # the run's secret, as a file
        ctl = launch("--replicas", str(REPLICAS), "--min-replicas", "1", "--join-timeout-s", "30",
                     "--heartbeat-timeout-s", "60", "--job-id", "bench",
                     "--job-secret-file", str(secret_file(tmp, os.environ[job_secret.ENV_JOB_SECRET])), env=env)
    try:
        gloo, coordinators = free_port(), ",".join(f"127.0.0.1:{free_port()}" for _ in range(REPLICAS))
        flags = ["--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads),
                 "--seq-len", str(args.seq_len), "--rows", str(args.rows), "--steps", str(args.steps),
                 "--warmup", str(args.warmup), "--catchup-repeats", str(args.catchup_repeats)]
        workers = [subprocess.Popen(
            [sys.executable, "-m", "bench.hsdp", "--role", "worker", "--rank", str(g), "--controller", ctl.grpc,
             "--gloo-port", str(gloo), "--coordinators", coordinators, *flags], cwd=REPO, env=env,
            stdout=subprocess.PIPE, text=True) for g in range(REPLICAS * RANKS)]
        results = [json.loads(w.communicate(timeout=args.timeout_s)[0].strip().splitlines()[-1]) for w in workers]
        if any(w.returncode for w in workers):
            raise RuntimeError(f"a worker failed: exit codes {[w.returncode for w in workers]}")
    finally:
        ctl.stop()
    limits.append(measure_tcp(1, 256 << 20, 2))
    torch_s = [max(v) for v in zip(*(r["torch"] for r in results))]
    ft_s = [max(v) for v in zip(*(r["ft"] for r in results))]
    torch_ms, ft_ms = statistics.median(torch_s) * 1e3, statistics.median(ft_s) * 1e3
    fetches = [r["fetch"] for r in results if r["fetch"]]
    # each repeat's time is the slower rank's; the best repeat counts (as bench.overhead's catch-up)
    best = min(range(args.catchup_repeats), key=lambda i: max(f["seconds"][i] for f in fetches))
    replica_gbs = sum(f["bytes"] for f in fetches) / max(f["seconds"][best] for f in fetches) / 1e9
    return {"replicas": REPLICAS, "ranks_per_replica": RANKS, "params": results[0]["params"], "steps": args.steps,
            "state_bytes_per_rank_fsdp": max(r["held_bytes"] for r in results),
            "state_bytes_per_rank_replicated": _replicated_bytes(args),
            "step_ms_torch_hsdp": round(torch_ms, 1), "step_ms_ft_hsdp": round(ft_ms, 1),
            "overhead_pct": round((ft_ms - torch_ms) / torch_ms * 100, 2),
            "catchup_shard_bytes": max(f["bytes"] for f in fetches),
            "catchup_shard_gbs": round(min(f["bytes"] / f["seconds"][best] for f in fetches) / 1e9, 3),
            "catchup_repeats": args.catchup_repeats,
            "catchup_replica_gbs": round(replica_gbs, 3), "tcp_one_stream_gbs": round(max(limits), 3),
            "catchup_shard_of_limit": round(replica_gbs / max(limits), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hsdp", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--rows", type=int, default=2, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--catchup-repeats", type=int, default=3, help="sharded fetches, the best counts")
    p.add_argument("--timeout-s", type=float, default=1200.0)
    p.add_argument("--role", choices=["main", "worker"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--controller", default="", help=argparse.SUPPRESS)
    p.add_argument("--gloo-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--coordinators", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.catchup_repeats < 1:
        p.error(f"--catchup-repeats must be at least 1, got {args.catchup_repeats}")
    # The ports authenticate as in production: one secret for this run, inherited by the workers.
    os.environ.setdefault(job_secret.ENV_JOB_SECRET, job_secret.generate())
    if args.role == "worker":
        _worker(args)
        return 0
    result = measure(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
