"""Semi-synchronous replicas against synchronous ones: bytes across replicas, speed on a slow link, loss.

    python -m bench.semisync --json [--configs sync:1,local_sgd:8,diloco:8] [--link-mb-s 50]

Each configuration (`mode:H`) starts the product as a user does -- `fthsdp controller --sync-mode
MODE --sync-every H` and one trainer process per replica (this module with --worker, the
FTHSDP_SYNC_* settings of a user's script) -- on the same model (an MLP), the same data (a
fixed random teacher network; replica r's batch p is a function of the seed, r and p only) and
the same number of samples per replica. One JSON line per configuration:

- `bytes_across_replicas_per_sample`: bytes every replica's FTAR endpoint sent (the only
  traffic between replicas; the controller's quorum messages are not counted: a few hundred
  bytes per sync) divided by the samples the run committed;
- `samples_per_s`: samples committed per second from the first commit to the last, every
  replica's FTAR sends paced by a token bucket in the transport (`link`: the stated rate per
  replica, a stand-in for a WAN link; network namespaces with tc are not used here);
- `heldout_loss`: the mean squared error of the final global model on held-out samples, at
  equal samples; `heldout_loss_sync` and, with --seeds > 1, the synchronous run's band over seeds.
- torchft's own DiLoCo is not run (`torchft`: why).

Every line also names its `mode`, `sync_every`, `replicas`, `inner_steps`, `batch_size`, `link`,
`params`, `commits` (syncs committed) and `replicas_agree` (one global model at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The fields every line has (tests/bench/smoke.py checks them); non-sync lines add
#: bytes_ratio_vs_sync, speedup_vs_sync, heldout_loss_sync, heldout_loss_sync_band and torchft.
FIELDS: dict[str, object] = {
    "mode": str, "sync_every": int, "replicas": int, "inner_steps": int, "batch_size": int, "link": str,
    "bytes_across_replicas_per_sample": float, "samples_per_s": float, "heldout_loss": float,
    "replicas_agree": bool, "params": int, "commits": int,
}
TORCHFT = ("not run: torchft 0.2 is not installed in this environment (its wheel downloads, but it is not in the "
           "shared venv), and its Gloo traffic could not be put on this token-bucket link; no comparison")


# ---------------------------------------------------------------- the slowed link (token bucket)


class Pacer:
    """A token bucket of `rate` bytes/s without burst: sends of every connection of one endpoint
    leave one after the other at that rate (the replica's uplink)."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate, self.sent = rate_bytes_s, 0
        self._lock, self._free_at = threading.Lock(), 0.0

    def take(self, n: int) -> None:
        with self._lock:
            self.sent += n
            if self.rate <= 0:
                return
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + n / self.rate
            ready = self._free_at
        while (left := ready - time.monotonic()) > 0:
            time.sleep(left)


def paced_transport(pacer: Pacer, buffer_bytes: int):
    from ftar_kernels.transport import Connection, Listener, TcpTransport, Transport

    class PacedConnection(Connection):
        def __init__(self, inner: Connection) -> None:
            self._inner, self.peer = inner, inner.peer

        def send_all(self, data, timeout_s: float) -> None:
            pacer.take(len(data))
            self._inner.send_all(data, timeout_s)

        def recv_exact(self, into, timeout_s: float) -> None:
            self._inner.recv_exact(into, timeout_s)

        def recv_some(self, into, timeout_s: float) -> int:
            return self._inner.recv_some(into, timeout_s)

        def interrupt(self) -> None:
            self._inner.interrupt()

        def close(self) -> None:
            self._inner.close()

    class PacedListener(Listener):
        def __init__(self, inner: Listener) -> None:
            self._inner, self.address = inner, inner.address

        def accept(self, timeout_s: float):
            conn = self._inner.accept(timeout_s)
            return None if conn is None else PacedConnection(conn)

        def wake(self) -> None:
            self._inner.wake()

        def close(self) -> None:
            self._inner.close()

    class PacedTransport(Transport):
        def __init__(self) -> None:
            self.inner = TcpTransport(buffer_bytes)

        def listen(self, host: str, port: int) -> Listener:
            return PacedListener(self.inner.listen(host, port))

        def dial(self, address: str, timeout_s: float) -> Connection:
            return PacedConnection(self.inner.dial(address, timeout_s))

    return PacedTransport()


# ---------------------------------------------------------------- one replica (a user's script)


def _data(cfg: dict):
    import torch

    torch.manual_seed(10_007)  # the teacher: the same on every replica and in every run
    teacher = torch.nn.Sequential(torch.nn.Linear(cfg["features"], 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def batch_at(replica: str, position: int, rows: int | None = None):
        g = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + int(replica) * 100_003 + position)
        x = torch.randn(rows or cfg["batch_size"], cfg["features"], generator=g)
        with torch.no_grad():
            return x, teacher(x) + 0.05 * torch.randn(x.shape[0], 1, generator=g)

    return batch_at


def worker(cfg: dict) -> dict:
    import torch

    from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, Seams
    from ftar_kernels import FtarEndpoint

    pacer = Pacer(cfg["link_bytes_s"])

    def paced(ep: FtarEndpoint) -> FtarEndpoint:
        host = ep.address.rpartition(":")[0]
        ep.close()
        return FtarEndpoint.open(host, 0, ep.settings, transport=paced_transport(pacer, ep.settings.socket_buffer_bytes))

    torch.manual_seed(cfg["seed"])
    f, hidden = cfg["features"], cfg["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(f, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.GELU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    h = cfg["sync_every"]
    settings = RuntimeSettings.from_env(
        job_id="semisync", replica_id=cfg["replica_id"], controller_address=cfg["controller"],
        insecure_trainer_ports=True, sync_mode=cfg["mode"], sync_every_steps=h, max_steps=cfg["steps"] // h,
        quorum_timeout_s=120.0, gather_timeout_s=120.0, allreduce_timeout_s=120.0, digest_every_steps=0)
    manager = Manager(model, opt, settings, seams=Seams(endpoint=paced)).start()
    ft = FaultTolerantOptimizer(manager, opt)
    batch_at = _data(cfg)
    commits: list[float] = []
    for x, y in manager.batches(batch_at):
        step = manager.step
        ft.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        ft.step()
        if manager.step != step:
            commits.append(time.perf_counter())
    manager.close()
    hx, hy = batch_at("999", 0, cfg["heldout"])
    with torch.no_grad():
        heldout = torch.nn.functional.mse_loss(model(hx), hy).item()
    return {"bytes_sent": pacer.sent, "commits": len(commits), "window_s": commits[-1] - commits[0],
            "samples_in_window": (len(commits) - 1) * h * cfg["batch_size"], "heldout_loss": heldout,
            "params": sum(p.numel() for p in model.parameters()), "outer_bytes": manager.outer.nbytes
            if manager.outer is not None else 0}


# ---------------------------------------------------------------- the runs


def run_config(args, mode: str, h: int, seed: int) -> dict:
    from controller.launch import launch

    ctl = launch("--replicas", str(args.replicas), "--min-replicas", str(args.replicas), "--job-id", "semisync",
                 "--sync-mode", mode, "--sync-every", str(h), "--join-timeout-s", "60", insecure=True,
                 cwd=str(ROOT), timeout_s=120.0)
    try:
        procs = []
        for r in range(args.replicas):
            cfg = {"replica_id": str(r), "controller": ctl.grpc, "mode": mode, "sync_every": h, "seed": seed,
                   "steps": args.steps, "batch_size": args.batch_size, "features": args.features,
                   "hidden": args.hidden, "lr": args.lr, "heldout": args.heldout,
                   "link_bytes_s": args.link_mb_s * 1e6}
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.semisync", "--worker", json.dumps(cfg)],
                                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env={**os.environ, "PYTHONPATH": str(ROOT)}))
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise SystemExit(f"bench.semisync: {mode}:{h} did not finish within {args.timeout_s}s")
            if p.returncode != 0:
                raise SystemExit(f"bench.semisync: a {mode}:{h} replica failed ({p.returncode}): {err[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        ctl.stop()
    samples = args.replicas * args.steps * args.batch_size
    window = max(o["window_s"] for o in outs)
    losses = {round(o["heldout_loss"], 12) for o in outs}
    return {"bytes_across_replicas_per_sample": sum(o["bytes_sent"] for o in outs) / samples,
            "samples_per_s": sum(o["samples_in_window"] for o in outs) / window if window > 0 else 0.0,
            "heldout_loss": outs[0]["heldout_loss"], "replicas_agree": len(losses) == 1,
            "params": outs[0]["params"], "commits": outs[0]["commits"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.semisync", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON line per configuration (the default prints them too)")
    p.add_argument("--configs", default="sync:1,local_sgd:8,diloco:8", help="mode:H,... (the first sync:1 is the "
                   "baseline; one is added when missing)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=64, help="inner steps per replica (a multiple of every H)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3, help="the inner (sync: the only) AdamW learning rate")
    p.add_argument("--heldout", type=int, default=2048, help="held-out samples")
    p.add_argument("--link-mb-s", type=float, default=50.0, help="each replica's FTAR send rate, MB/s (0: unpaced)")
    p.add_argument("--seeds", type=int, default=1, help="seeds of the synchronous run (its loss band)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest one configuration may take")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    try:
        configs = [(m, int(h)) for m, _, h in (c.partition(":") for c in args.configs.split(","))]
    except ValueError:
        p.error(f"--configs must be mode:H,..., got {args.configs!r}")
    bad = [f"{m}:{h}" for m, h in configs if m not in ("sync", "local_sgd", "diloco") or h < 1 or args.steps % h
           or (m == "sync" and h != 1)]
    if bad or args.replicas < 2 or args.seeds < 1:
        p.error(f"configurations {bad} need a mode of sync (H 1), local_sgd or diloco and an H that divides --steps "
                f"{args.steps}; --replicas >= 2, --seeds >= 1")
    if ("sync", 1) not in configs:
        configs.insert(0, ("sync", 1))
    configs.sort(key=lambda c: c != ("sync", 1))
    link = (f"token bucket in the FTAR transport (bench/semisync.py Pacer), {args.link_mb_s:g} MB/s per replica"
            if args.link_mb_s > 0 else "unpaced loopback")
    base = None
    for mode, h in configs:
        result = run_config(args, mode, h, seed=0)
        line = {"bench": "semisync", "mode": mode, "sync_every": h, "replicas": args.replicas,
                "inner_steps": args.steps, "batch_size": args.batch_size, "link": link, **result}
        if base is None:
            base = result
            band = [result["heldout_loss"]] + [run_config(args, mode, h, seed=s)["heldout_loss"]
                                               for s in range(1, args.seeds)]
            base["band"] = [min(band), max(band)]
        line.update({"bytes_ratio_vs_sync": result["bytes_across_replicas_per_sample"]
                     / base["bytes_across_replicas_per_sample"],
                     "speedup_vs_sync": result["samples_per_s"] / base["samples_per_s"] if base["samples_per_s"] else 0,
                     "heldout_loss_sync": base["heldout_loss"], "heldout_loss_sync_band": base["band"],
                     "torchft": TORCHFT if mode == "diloco" else ""})
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
