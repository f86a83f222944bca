"""The trainer runtime's steady-state overhead and catch-up bandwidth (no failures).

    python -m bench.overhead --json

Overhead: `--replicas` processes train the same small MLP on the same data two ways, step
by step in alternation (so background load hits both alike): plain torch.distributed
(Gloo all-reduce of the flattened gradients across replicas, divide, optimizer step) and
through this runtime (a controller from the CLI, one Manager per replica: quorum, FTAR,
vote, commit). Reported: median step times and overhead_pct = (ft - plain) / plain, and
protocol_us_per_step: the time the Manager spent inside the pure step protocol per step;
telemetry_us_per_step / telemetry_pct: the time spent recording collectives in the rank's
telemetry ring per step (on, as under an agent), and its share of the runtime's step.
Digest: digest_ms is one digest of the benchmark model's whole committed state (weights,
AdamW moments, ledger); digest_pct_at_default is its share of a step at the default
interval (one digest every RuntimeSettings.digest_every_steps steps).
Catch-up: a source process serves a `--catchup-bytes` state from CPU memory and this
process fetches it over loopback HTTP into its own tensors (checksum verified);
catchup_gbs = bytes / seconds / 1e9 (best of --catchup-repeats); catchup_of_limit is it over
one-stream loopback TCP measured in the same run (bench/limits.py: tcp_one_stream_gbs).
Fan-out: one plan broadcast + commit vote + decision round of the real leader channel
against --fanout-ranks simulated ranks (all on this machine, so the ranks' own work counts).

One JSON line (FIELDS; a --skip leaves its part's fields out): replicas, steps, step_ms_plain,
step_ms_ft, overhead_pct, protocol_us_per_step, telemetry_us_per_step, telemetry_pct, digest_ms,
digest_every_steps, digest_pct_at_default, catchup_bytes, catchup_s, catchup_gbs,
tcp_one_stream_gbs, catchup_of_limit, fanout_ranks, fanout_s, fanout_vote_decision_s.
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
from pathlib import Path

from agent.telemetry import ring_dir
from bench.common import free_port, secret_file
from controller.launch import launch
from fthsdp.telemetry import ENV_TELEMETRY_FILE
from protos import job_secret

REPO = Path(__file__).resolve().parents[1]
#: the fields of the JSON line (`python -m bench.overhead --json`) and their types
FIELDS = {"replicas": int, "steps": int, "step_ms_plain": float, "step_ms_ft": float, "overhead_pct": float,
          "protocol_us_per_step": float, "telemetry_us_per_step": float, "telemetry_pct": float,
          "digest_ms": float, "digest_every_steps": int, "digest_pct_at_default": float, "catchup_bytes": int,
          "catchup_s": float, "catchup_gbs": float, "tcp_one_stream_gbs": float, "catchup_of_limit": float,
          "fanout_ranks": int, "fanout_s": float, "fanout_vote_decision_s": float}


def _model(hidden: int, width: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, width))


def _step_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
    from fthsdp.sync.gradients import flatten_grads, unflatten_grads_

    torch.set_num_threads(1)
    r = args.rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.gloo_port}", rank=r,
                            world_size=args.replicas)
    plain, ft_model = _model(args.hidden, args.width), _model(args.hidden, args.width)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    ft_opt_inner = torch.optim.AdamW(ft_model.parameters(), lr=1e-3)
    # Collective telemetry on, as under an agent: the ring in a private directory.
    os.environ[ENV_TELEMETRY_FILE] = os.path.join(tempfile.mkdtemp(prefix="fthsdp-bench-", dir=ring_dir()), "slot-0.ring")
    manager = Manager(ft_model, ft_opt_inner, RuntimeSettings(
        job_id="bench", replica_id=str(r), controller_address=args.controller, apply_lr_scale=False,
        ftar_chunk_bytes=4 << 20, job_secret=job_secret.from_env())).start()
    telemetry_s = _time_recording(manager.collectives.telemetry)
    ft_opt = FaultTolerantOptimizer(manager, ft_opt_inner)
    params = list(plain.parameters())

    def batch(position: int):
        g = torch.Generator().manual_seed(r * 1_000_003 + position)
        return torch.randn(args.batch, args.width, generator=g)

    def plain_step(position: int) -> None:
        plain_opt.zero_grad()
        x = batch(position)
        torch.nn.functional.mse_loss(plain(x), x).backward()
        flat = flatten_grads(params)
        dist.all_reduce(flat)
        flat.div_(args.replicas)
        unflatten_grads_(params, flat)
        plain_opt.step()

    batches = manager.batches(lambda _replica, position: batch(position))

    def ft_step() -> None:
        x = next(batches)
        ft_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ft_model(x), x)
        loss.backward()
        if not ft_opt.step(loss):
            raise RuntimeError(f"step failed without injected faults: {manager.last_outcome}")

    plain_times, ft_times = [], []
    protocol_s = recorded_s = 0.0
    for i in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        plain_step(i)
        t1 = time.perf_counter()
        before, recorded = manager.protocol_s, telemetry_s[0]
        ft_step()
        t2 = time.perf_counter()
        if i >= args.warmup:
            plain_times.append(t1 - t0)
            ft_times.append(t2 - t1)
            protocol_s += manager.protocol_s - before
            recorded_s += telemetry_s[0] - recorded
    records = manager.collectives.telemetry._appended
    manager.close()
    print(json.dumps({"rank": r, "plain": plain_times, "ft": ft_times, "protocol_s": protocol_s,
                      "telemetry_s": recorded_s, "records": records}), flush=True)


def _time_recording(ring) -> list[float]:
    """Wrap the ring writer's methods with a timer (bench only): the CPU seconds this thread spent
    recording (thread time, so a loaded machine's preemptions do not count as recording)."""
    spent = [0.0]
    for name in ("record_join", "record_progress", "record_done"):
        inner = getattr(ring, name)

        def timed(*a, _inner=inner, **k):
            t0 = time.thread_time()
            try:
                return _inner(*a, **k)
            finally:
                spent[0] += time.thread_time() - t0
        setattr(ring, name, timed)
    return spent


def measure_overhead(args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-") as tmp:  # the run's secret, as a file
        ctl = launch("--replicas", str(args.replicas), "--min-replicas", "1", "--join-timeout-s", "5",
                     "--heartbeat-timeout-s", "10", "--job-id", "bench",
                     "--job-secret-file", str(secret_file(tmp, os.environ[job_secret.ENV_JOB_SECRET])), env=env)
    try:
        controller = ctl.grpc
        gloo = free_port()
        workers = [subprocess.Popen(
            [sys.executable, "-m", "bench.overhead", "--role", "step-worker", "--rank", str(r), "--controller",
             controller, "--gloo-port", str(gloo), *_shared_flags(args)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, text=True) for r in range(args.replicas)]
        results = [json.loads(w.communicate(timeout=args.timeout_s)[0].strip().splitlines()[-1]) for w in workers]
    finally:
        ctl.stop()
    # A step's time is the slowest replica's; report medians over steps.
    plain = [max(vals) for vals in zip(*(r["plain"] for r in results))]
    ft = [max(vals) for vals in zip(*(r["ft"] for r in results))]
    plain_ms, ft_ms = statistics.median(plain) * 1e3, statistics.median(ft) * 1e3
    protocol_us = max(r["protocol_s"] for r in results) / args.steps * 1e6
    telemetry_us = max(r["telemetry_s"] for r in results) / args.steps * 1e6
    return {"step_ms_plain": round(plain_ms, 2), "step_ms_ft": round(ft_ms, 2),
            "overhead_pct": round((ft_ms - plain_ms) / plain_ms * 100, 2),
            "protocol_us_per_step": round(protocol_us, 1),
            # collective telemetry (fthsdp.telemetry): time in the ring writer per step, its share of a step
            "telemetry_us_per_step": round(telemetry_us, 1),
            "telemetry_pct": round(telemetry_us / (ft_ms * 1e3) * 100, 4),
            "telemetry_records_per_step": round(max(r["records"] for r in results) / (args.warmup + args.steps), 1)}


def measure_digest(args: argparse.Namespace, step_ms: float | None) -> dict:
    """One digest of the benchmark model's committed state after an AdamW step (best of 5)."""
    import torch

    from fthsdp.settings import RuntimeSettings
    from fthsdp.state.digest import rank_digest

    torch.set_num_threads(1)
    model = _model(args.hidden, args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width)
    torch.nn.functional.mse_loss(model(x), x).backward()
    opt.step()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        rank_digest(1, '{"positions": {"0": 1}}', model, opt, {"rng": {"seed": 1}})
        times.append(time.perf_counter() - t0)
    digest_ms = min(times) * 1e3
    every = RuntimeSettings().digest_every_steps
    out = {"digest_ms": round(digest_ms, 2), "digest_every_steps": every}
    if step_ms:
        out["digest_pct_at_default"] = round(digest_ms / (every * step_ms) * 100, 3)
    return out


def _shared_flags(args: argparse.Namespace) -> list[str]:
    return ["--replicas", str(args.replicas), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--hidden", str(args.hidden), "--width", str(args.width), "--batch", str(args.batch)]


def _catchup_source(args: argparse.Namespace) -> None:
    import torch

    from fthsdp.state.serve import StateServer
    from fthsdp.state.stream import build_manifest, live_entries

    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.empty(args.catchup_bytes // 4).uniform_())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def snapshot():
        entries, scalars = live_entries(model, opt)
        groups = opt.state_dict()["param_groups"]
        return build_manifest(0, "{}", entries, scalars, groups), [t for _, t in entries]

    server = StateServer("127.0.0.1", 0, snapshot, "bench",
                         key=job_secret.from_env().key(job_secret.PURPOSE_STATE)).start()
    server.serve(0)
    print(server.address, flush=True)
    sys.stdin.readline()  # serve until the parent closes our stdin
    server.close()


def measure_catchup(args: argparse.Namespace) -> dict:
    import torch

    from bench.limits import measure_tcp
    from fthsdp.state.fetch import fetch_once
    from fthsdp.state.stream import StateTarget

    src = subprocess.Popen([sys.executable, "-m", "bench.overhead", "--role", "catchup-source",
                            "--catchup-bytes", str(args.catchup_bytes)], cwd=REPO, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        address = src.stdout.readline().strip()
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(torch.zeros(args.catchup_bytes // 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        times, limits = [], []
        for _ in range(args.catchup_repeats):  # in alternation with the ceiling: load hits both alike
            t0 = time.perf_counter()
            fetch_once(address, 0, "bench", lambda: StateTarget(model, opt), 120.0,
                       key=job_secret.from_env().key(job_secret.PURPOSE_STATE))
            times.append(time.perf_counter() - t0)
            limits.append(measure_tcp(1, args.catchup_bytes, 1))
    finally:
        src.stdin.close()
        src.wait(30)
    best, limit = min(times), max(limits)
    gbs = args.catchup_bytes / best / 1e9
    return {"catchup_bytes": args.catchup_bytes, "catchup_s": round(best, 3), "catchup_gbs": round(gbs, 3),
            "tcp_one_stream_gbs": round(limit, 3), "catchup_of_limit": round(gbs / limit, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--catchup-bytes", type=int, default=1 << 30)
    p.add_argument("--catchup-repeats", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--fanout-ranks", type=int, default=8192, help="ranks in the leader fan-out + vote round")
    p.add_argument("--skip", choices=["overhead", "digest", "catchup", "fanout"], action="append", default=[])
    p.add_argument("--role", choices=["main", "step-worker", "catchup-source"], default="main",
                   help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--controller", default="", help=argparse.SUPPRESS)
    p.add_argument("--gloo-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # The ports authenticate as in production: one secret for this run, inherited by the workers.
    os.environ.setdefault(job_secret.ENV_JOB_SECRET, job_secret.generate())
    if args.role == "step-worker":
        _step_worker(args)
        return 0
    if args.role == "catchup-source":
        _catchup_source(args)
        return 0
    result: dict = {"replicas": args.replicas, "steps": args.steps}
    if "overhead" not in args.skip:
        result.update(measure_overhead(args))
    if "digest" not in args.skip:
        result.update(measure_digest(args, result.get("step_ms_ft")))
    if "catchup" not in args.skip:
        result.update(measure_catchup(args))
    if "fanout" not in args.skip:
        from bench.channel_simulation import simulate_fanout_and_vote

        t = simulate_fanout_and_vote(args.fanout_ranks)
        result.update({"fanout_ranks": t.ranks, "fanout_leader_broadcast_s": round(t.broadcast_s, 3),
                       "fanout_s": round(t.fanout_s, 3),
                       "fanout_vote_decision_s": round(t.decision_s, 3)})
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
