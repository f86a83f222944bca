"""Semi-synchronous replicas against synchronous ones, and against torchft's DiLoCo: bytes, speed on a slowed link, loss.

    python -m bench.semisync --json [--configs sync:1,local_sgd:8,diloco:8[,streaming_diloco:8:2]]
                             [--link auto|veth|bucket] [--link-mb-s 50] [--seeds 3] [--no-torchft]
                             [--wire-dtype float32|bfloat16] [--threads 1] [--plan-ahead-steps P]
                             [--inner-optimizer adamw|adamw_fused]

Each configuration (`mode:H` or `mode:H:F`, F the fragments of streaming DiLoCo) starts the
product as a user does -- `fthsdp controller --sync-mode MODE --sync-every H [--sync-fragments
F] --job-secret-file FILE` and one trainer process per replica (bench/semisync_workers.py, a
user's script reading the FTHSDP_SYNC_* settings and the job secret; FTHSDP_SYNC_FRAGMENTS only
for F > 1), every port authenticating its peer as in production -- on the same model (an MLP),
the same data (a fixed random teacher network) and the same inner steps per replica. The
default configurations add `streaming_diloco:8:2` where the mode exists (protos/sync_modes.py).

The link (`link`, bench/semisync_link.py): where the machine allows (root, iproute2, nftables)
every replica's trainer is in a network namespace of its own, joined to a bridge by a veth pair
capped by tbf at --link-mb-s each way ("veth+tbf 50MB/s"), so every byte between replicas
crosses it, ours and torchft's alike; else a token bucket in our FTAR transport paces each
replica's sends (it cannot pace torchft's Gloo traffic: then torchft and our DiLoCo are compared
on the plain loopback link, and `torchft` says so).

One JSON line per configuration (FIELDS):

- `bytes_across_replicas_per_sample`: the bytes every replica's FTAR endpoint sent (the traffic
  between replicas; the controller's quorum messages are not counted) divided by the samples
  trained; `wire_bytes_per_sample`: on the veth link, everything the replicas' interfaces sent
  (headers and control traffic too), else null; `bytes_ratio_vs_sync`;
- `samples_per_s`: samples committed per second from the first commit to the last (summed over
  replicas); `speedup_vs_sync`;
- `heldout_loss`: the mean squared error of the final global model on held-out samples, after
  the same samples as every other line (`samples_per_replica`); `heldout_loss_sync` (seed 0),
  `heldout_loss_sync_band` ([min, max] of the synchronous run over `sync_seeds` seeds: --seeds)
  and `heldout_vs_sync_band`: "inside", "below" (lower loss than every synchronous seed) or
  "above";
- `torchft` on the `diloco` line (the first one): what ran and what could not be made equal, or
  "not run: why"; with it `samples_per_s_torchft`, `ratio` (ours / torchft on the same link),
  `heldout_loss_torchft` and `heldout_torchft_vs_sync_band` (null when not run) and
  `wire_bytes_per_sample_torchft` (veth only).

Every line also names `mode`, `sync_every`, `sync_fragments`, `sync_wire_dtype` (the
pseudo-gradient's wire dtype as the trainers' settings hold it: --wire-dtype bfloat16 asks for
it, a runtime without the setting says float32), `sync_overlap_steps` (the inner steps each of
streaming_diloco's fragment syncs overlaps: --overlap-steps, else the runtime's default; 0 in
the other modes), `time_per_sync_s` (replica 0's seconds per committed sync at its due step,
`sync_s`, in the runtime at its other steps, `runtime_s`, and in forward/backward,
`compute_s`: where the time goes), `sync_plan_ahead_steps` (how many inner steps before a
blocking sync is due its quorum is asked for: --plan-ahead-steps, else the runtime's default;
0 in sync mode and with an overlap) and `plans_in_at_due` (of replica 0's syncs asked for
ahead, the share whose plan was in by the due step; null without), `replicas`, `inner_steps`, `batch_size`,
`inner_optimizer` (--inner-optimizer), `params`, `commits` (syncs committed, per replica),
`replicas_agree` (one global model at
the end) and `load` (the machine's 1/5/15-minute load averages when the line was printed: the
rates are only as good as the machine was quiet). Every replica process, ours and torchft's, runs torch on --threads threads (default 1:
the replicas share this machine's cores; oversubscribed, torchft's inner steps ran several times
slower on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import load, secret_file
from bench.semisync_link import KINDS, open_link
from protos import job_secret
from protos.sync_modes import SYNC_MODES

ROOT = Path(__file__).resolve().parents[1]
#: The fields every line has (tests/bench/test_semisync_bench.py checks them); the diloco line
#: adds samples_per_s_torchft, ratio, heldout_loss_torchft, heldout_torchft_vs_sync_band and
#: wire_bytes_per_sample_torchft.
FIELDS: dict[str, object] = {
    "mode": str, "sync_every": int, "sync_fragments": int, "sync_wire_dtype": str, "replicas": int,
    "inner_steps": int, "batch_size": int,
    "link": str, "bytes_across_replicas_per_sample": float, "wire_bytes_per_sample": float | None,
    "samples_per_s": float, "heldout_loss": float, "samples_per_replica": int, "replicas_agree": bool,
    "params": int, "commits": int, "bytes_ratio_vs_sync": float, "speedup_vs_sync": float,
    "heldout_loss_sync": float, "heldout_loss_sync_band": list, "sync_seeds": int, "heldout_vs_sync_band": str,
    "torchft": str, "load": list, "sync_overlap_steps": int, "time_per_sync_s": dict,
    "sync_plan_ahead_steps": int, "plans_in_at_due": float | None, "inner_optimizer": str,
}
TORCHFT_FIELDS = ("samples_per_s_torchft", "ratio", "heldout_loss_torchft", "heldout_torchft_vs_sync_band",
                  "wire_bytes_per_sample_torchft")
TORCHFT_DIFFERENCES = (
    "torchft 0.2 DiLoCo (Manager + ProcessGroupGloo, its own lighthouse, init_sync off: both start from the "
    "same seeded weights) on the same model, H, data, samples, inner and outer optimizers; not equal: its "
    "all-reduce is Gloo's per parameter tensor in float32 and it heartbeats its lighthouse every 100 ms, ours is "
    "FTAR over the whole pseudo-gradient with a two-phase commit; it keeps no data ledger or digests")


@dataclass(frozen=True)
class Config:
    mode: str
    every: int
    fragments: int = 1

    @property
    def label(self) -> str:
        return f"{self.mode}:{self.every}" + (f":{self.fragments}" if self.fragments > 1 else "")


SYNC = Config("sync", 1)


#: the configurations a plain run measures
DEFAULT_CONFIGS = "sync:1,local_sgd:8,diloco:8,streaming_diloco:8:2"


def parse_configs(text: str, steps: int) -> list[Config]:
    """The configurations of `text` (mode:H[:F],...), sync:1 first (added when missing).
    ValueError naming every bad one: an unknown mode, an H that does not divide `steps`, sync with
    H != 1, fragments other than 1 outside streaming_diloco or not dividing H."""
    configs, bad = [], []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            mode, every, fragments = parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
        except (IndexError, ValueError):
            bad.append(f"{item!r} is not mode:H or mode:H:F")
            continue
        if len(parts) > 3 or mode not in SYNC_MODES:
            bad.append(f"{item!r}: the mode must be one of {', '.join(SYNC_MODES)}")
        elif every < 1 or steps % every:
            bad.append(f"{item!r}: H must be >= 1 and divide --steps {steps}")
        elif mode == "sync" and every != 1:
            bad.append(f"{item!r}: sync meets every step (H 1)")
        elif fragments < 1 or (fragments > 1 and (mode != "streaming_diloco" or every % fragments)):
            bad.append(f"{item!r}: fragments F > 1 need streaming_diloco and must divide H")
        else:
            configs.append(Config(mode, every, fragments))
    if bad:
        raise ValueError("--configs: " + "; ".join(bad))
    return [SYNC] + [c for c in dict.fromkeys(configs) if c != SYNC]


def band_position(loss: float, band: list[float]) -> str:
    return "below" if loss < band[0] else "above" if loss > band[1] else "inside"


# ---------------------------------------------------------------- processes


def _replicas(args, link, impl: str, extra: dict, env: dict, what: str) -> list[dict]:
    """Start one `impl` worker per replica (each in its replica's place on the link) and collect
    their JSON lines; SystemExit naming `what` when one fails or the run outlasts --timeout-s."""
    procs = []
    deadline = time.monotonic() + args.timeout_s
    try:
        for r in range(args.replicas):
            cfg = {"impl": impl, "replica_id": str(r), "host": link.replica_host(r), "replicas": args.replicas,
                   "steps": args.steps, "batch_size": args.batch_size, "features": args.features,
                   "hidden": args.hidden, "lr": args.lr, "heldout": args.heldout, "threads": args.threads,
                   "inner_optimizer": args.inner_optimizer,
                   "bucket_bytes_s": link.bucket_bytes_s, **extra}
            with link.entered(link.replica_node(r)):  # the child lives in the replica's namespace
                procs.append(subprocess.Popen([sys.executable, "-m", "bench.semisync", "--worker", json.dumps(cfg)],
                                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              stdin=subprocess.DEVNULL,
                                              env={**os.environ, "PYTHONPATH": str(ROOT), **env}))
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise SystemExit(f"bench.semisync: {what} did not finish within {args.timeout_s:g}s") from None
            if p.returncode != 0:
                raise SystemExit(f"bench.semisync: a {what} replica failed ({p.returncode}): {err[-3000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _measure(args, link, outs: list[dict], wire_before: list[int | None]) -> dict:
    samples = sum(o["inner_steps"] for o in outs) * args.batch_size
    spans = [(o["commit_times"][-1], o["commit_times"][0]) for o in outs if len(o["commit_times"]) > 1]
    window = max((last[0] - first[0] for last, first in spans), default=0.0)
    in_window = sum(last[1] - first[1] for last, first in spans) * args.batch_size
    wire = [link.wire_bytes(r) for r in range(args.replicas)]
    return {"wire_bytes_per_sample": None if None in wire or None in wire_before else
            sum(a - b for a, b in zip(wire, wire_before)) / samples,
            "samples_per_s": in_window / window if window > 0 else 0.0,
            "heldout_loss": outs[0]["heldout_loss"], "samples_per_replica": samples // args.replicas,
            "replicas_agree": len({round(o["heldout_loss"], 12) for o in outs}) == 1,
            "params": outs[0]["params"], "commits": outs[0]["commits"],
            "sync_wire_dtype": outs[0].get("wire_dtype", "float32"),
            "sync_overlap_steps": outs[0].get("overlap_steps", 0),
            "sync_plan_ahead_steps": outs[0].get("plan_ahead_steps", 0),
            "plans_in_at_due": (round(outs[0]["plans_in_at_due"] / outs[0]["syncs_begun_ahead"], 4)
                                if outs[0].get("syncs_begun_ahead") and not outs[0].get("overlap_steps") else None),
            "time_per_sync_s": _per_sync(outs),
            "bytes_sent": sum(o.get("bytes_sent", 0) for o in outs)}


def _per_sync(outs: list[dict]) -> dict | None:
    """Replica 0's time per committed sync (fthsdp only): at its due step (`sync_s`: the wait
    for the sync and the commit), in the runtime at the other steps (`runtime_s`), and in the
    script's forward/backward (`compute_s`)."""
    o = outs[0]
    if "sync_s" not in o or not o["commits"]:
        return None
    return {k: round(o[k] / o["commits"], 5) for k in ("sync_s", "runtime_s", "compute_s")}


def run_fthsdp(args, link, config: Config, seed: int) -> dict:
    from controller.launch import launch

    flags = ["--replicas", str(args.replicas), "--min-replicas", str(args.replicas), "--job-id", "semisync",
             "--sync-mode", config.mode, "--sync-every", str(config.every), "--join-timeout-s", "60",
             "--host", link.controller_host]
    env = {}
    if config.fragments > 1:  # only then: a runtime without streaming DiLoCo knows neither
        flags += ["--sync-fragments", str(config.fragments)]
        env["FTHSDP_SYNC_FRAGMENTS"] = str(config.fragments)
    if args.wire_dtype != "float32" and config.mode != "sync":
        env["FTHSDP_SYNC_WIRE_DTYPE"] = args.wire_dtype
    if args.overlap_steps is not None and config.mode == "streaming_diloco":
        env["FTHSDP_SYNC_OVERLAP_STEPS"] = str(args.overlap_steps)
    if args.plan_ahead_steps is not None and config.mode in ("local_sgd", "diloco"):
        env["FTHSDP_SYNC_PLAN_AHEAD_STEPS"] = str(args.plan_ahead_steps)
    wire_before = [link.wire_bytes(r) for r in range(args.replicas)]
    with link.entered(link.controller_node), tempfile.TemporaryDirectory(prefix="fthsdp-bench-") as tmp:
        ctl = launch(*flags, "--job-secret-file", str(secret_file(tmp, os.environ[job_secret.ENV_JOB_SECRET])),
                     cwd=str(ROOT), timeout_s=120.0)
    try:
        outs = _replicas(args, link, "fthsdp", {"controller": ctl.grpc, "mode": config.mode,
                                                "sync_every": config.every, "seed": seed}, env,
                         f"{config.label} (seed {seed})")
    finally:
        ctl.stop()
    result = _measure(args, link, outs, wire_before)
    result["bytes_across_replicas_per_sample"] = result.pop("bytes_sent") / (result["samples_per_replica"]
                                                                             * args.replicas)
    return result


def run_torchft(args, link, every: int, seed: int) -> dict:
    from bench.torchft_yardstick import Lighthouse

    wire_before = [link.wire_bytes(r) for r in range(args.replicas)]
    with link.entered(link.controller_node):
        lighthouse = Lighthouse(args.replicas, host=link.controller_host)
    try:
        outs = _replicas(args, link, "torchft", {"lighthouse": lighthouse.address, "sync_every": every, "seed": seed},
                         {"GLOO_SOCKET_IFNAME": link.gloo_interface(), "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
                         f"torchft diloco:{every} (seed {seed})")
    finally:
        lighthouse.stop()
    result = _measure(args, link, outs, wire_before)
    result.pop("bytes_sent")
    return result


def torchft_side(args, link, config: Config, ours: dict, band: list[float]) -> dict:
    """The torchft fields of the diloco line (module docstring)."""
    from bench.torchft_yardstick import missing

    why = "--no-torchft" if args.no_torchft else missing()
    empty = dict.fromkeys(TORCHFT_FIELDS)
    if why:
        return {"torchft": f"not run: {why}", **empty}
    what = TORCHFT_DIFFERENCES + (f"; both on the same link, {link.name}" if link.caps_torchft else "")
    if not link.caps_torchft:  # the token bucket paces our FTAR only: compare both on the plain link
        plain = open_link("bucket", args.replicas, 0.0)
        ours = run_fthsdp(args, plain, config, seed=0)
        what += (f"; compared on the plain loopback link, not {link.name} (its token bucket cannot pace torchft's "
                 f"Gloo traffic): ours {ours['samples_per_s']:.1f} samples/s there")
        link = plain
    try:
        theirs = run_torchft(args, link, config.every, seed=0)
    except (SystemExit, RuntimeError, OSError) as exc:
        return {"torchft": f"failed: {exc}"[:2000], **empty}
    if theirs["samples_per_replica"] != ours["samples_per_replica"]:
        what += f"; samples differ: torchft {theirs['samples_per_replica']} per replica"
    return {"torchft": what, "samples_per_s_torchft": theirs["samples_per_s"],
            "ratio": ours["samples_per_s"] / theirs["samples_per_s"] if theirs["samples_per_s"] else None,
            "heldout_loss_torchft": theirs["heldout_loss"],
            "heldout_torchft_vs_sync_band": band_position(theirs["heldout_loss"], band),
            "wire_bytes_per_sample_torchft": theirs["wire_bytes_per_sample"]}


# ---------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.semisync", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON line per configuration (the default prints them too)")
    p.add_argument("--configs", help="mode:H[:F],... (sync:1, the baseline, is added when missing; default "
                   "sync:1,local_sgd:8,diloco:8 and streaming_diloco:8:2 where the mode exists)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=256,
                   help="inner steps per replica (a multiple of every H); fewer make the rate a measure of start-up")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3, help="the inner (sync: the only) AdamW learning rate")
    p.add_argument("--heldout", type=int, default=2048, help="held-out samples")
    p.add_argument("--link", default="auto", choices=KINDS, help="veth: namespaces + tbf (root); bucket: a token "
                   "bucket in our FTAR transport; auto: veth where the machine allows (default)")
    p.add_argument("--link-mb-s", type=float, default=50.0, help="each replica's link rate, MB/s (0: uncapped)")
    p.add_argument("--seeds", type=int, default=1, help="seeds of the synchronous run (its held-out loss band)")
    p.add_argument("--wire-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the pseudo-gradient's wire dtype for the non-sync configurations (FTHSDP_SYNC_WIRE_DTYPE)")
    p.add_argument("--overlap-steps", type=int, help="streaming_diloco's sync_overlap_steps (FTHSDP_SYNC_OVERLAP_STEPS; "
                   "default: the runtime's)")
    p.add_argument("--plan-ahead-steps", type=int, help="local_sgd's and diloco's sync_plan_ahead_steps "
                   "(FTHSDP_SYNC_PLAN_AHEAD_STEPS; default: the runtime's, 0)")
    p.add_argument("--inner-optimizer", default="adamw", choices=("adamw", "adamw_fused"),
                   help="the replicas' inner optimizer, ours and torchft's: torch's AdamW as a CPU script gets it "
                        "(one tensor at a time), or fused (one pass: inner steps about 2 ms shorter on this "
                        "model, so the link weighs more)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per replica process, ours and torchft's")
    p.add_argument("--no-torchft", action="store_true", help="do not run torchft's DiLoCo beside ours")
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest one configuration may take")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # The ports authenticate as in production: one secret for this run, inherited by the workers.
    os.environ.setdefault(job_secret.ENV_JOB_SECRET, job_secret.generate())
    if args.worker:
        from bench.semisync_workers import WORKERS

        cfg = json.loads(args.worker)
        print(json.dumps(WORKERS[cfg["impl"]](cfg)), flush=True)
        return 0
    try:
        configs = parse_configs(args.configs or DEFAULT_CONFIGS, args.steps)
    except ValueError as exc:
        p.error(str(exc))
    if args.replicas < 2 or args.seeds < 1 or args.link_mb_s < 0 or args.threads < 1:
        p.error(f"need --replicas >= 2, --seeds >= 1, --link-mb-s >= 0 and --threads >= 1, got {args.replicas}, "
                f"{args.seeds}, {args.link_mb_s:g}, {args.threads}")
    try:
        link = open_link(args.link, args.replicas, args.link_mb_s)
    except ValueError as exc:
        p.error(str(exc))
    try:
        run(args, link, configs)
    finally:
        link.close()
    return 0


def run(args, link, configs: list[Config]) -> None:
    base = run_fthsdp(args, link, SYNC, seed=0)
    band_losses = [base["heldout_loss"]] + [run_fthsdp(args, link, SYNC, seed=s)["heldout_loss"]
                                            for s in range(1, args.seeds)]
    band = [min(band_losses), max(band_losses)]
    torchft_done = False
    for config in configs:
        result = base if config == SYNC else run_fthsdp(args, link, config, seed=0)
        line = {"bench": "semisync", "mode": config.mode, "sync_every": config.every,
                "sync_fragments": config.fragments, "replicas": args.replicas, "inner_steps": args.steps,
                "batch_size": args.batch_size, "inner_optimizer": args.inner_optimizer, "link": link.name, **result,
                "bytes_ratio_vs_sync": result["bytes_across_replicas_per_sample"]
                / base["bytes_across_replicas_per_sample"],
                "speedup_vs_sync": result["samples_per_s"] / base["samples_per_s"] if base["samples_per_s"] else 0.0,
                "heldout_loss_sync": base["heldout_loss"], "heldout_loss_sync_band": band, "sync_seeds": args.seeds,
                "heldout_vs_sync_band": band_position(result["heldout_loss"], band), "torchft": ""}
        if config.mode == "diloco" and not torchft_done:
            line.update(torchft_side(args, link, config, result, band))
            torchft_done = True
        print(json.dumps({**line, "load": load()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
