"""`fthsdp demo`: train an MLP on scikit-learn's digits (or, with `--model gpt`, a small
decoder-only transformer on Python's documentation text, FSDP2 over 2 ranks per replica) with
R replicas on this machine, through the real controller, agents and runtime, while failures
are injected on a schedule.

    fthsdp demo [--model mlp|gpt] [--replicas 4] [--steps 200]
                [--failures kill-trainer@50:r1,kill-agent@130:r2] [--ranks-per-replica 1]
                [--lr-policy sqrt] [--out fthsdp-report] [--seed 0] [--no-baseline] [--warm-restarts]
                [--sync diloco --sync-every 8 [--outer-lr 0.7 --outer-momentum 0.9]]
                [--sync streaming_diloco --sync-every 8 --sync-fragments 2]

With --sync local_sgd or diloco the replicas meet every --sync-every (H) training steps
instead of every step: the controller runs the job in that mode and every trainer gets it in
its FTHSDP_SYNC_* environment (the trainer's loop is the same). With streaming_diloco and
--sync-fragments F (H a multiple of F) one fragment syncs every K = H / F training steps, each
fragment every H; otherwise K = H. --steps and the STEP of --failures then count training
steps (one batch per replica each); a run is --steps / K syncs, and a failure at step n with
n % K != 0 lands in that inner step, one at a multiple of K in the sync before step n.

Writes OUT/report.json, OUT/loss.png and OUT/healthy_replicas.png (logs and records under
OUT/run and OUT/baseline). Exit status: 0 when every check passed, 1 when a check failed or
the job did not finish, 2 for bad arguments (the message names the bad value).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from controller.settings import LR_POLICIES  # the controller computes the learning-rate factor
from fthsdp.demo.schedule import DIAGNOSED, ScheduleError, default_text, parse, steps_per_sync
from protos import timeout_rules
from protos import cli_flags as flags
from protos.sync_modes import SYNC_MODES

MODELS = ("mlp", "gpt")  # built by fthsdp/demo/workloads.py (not imported here: it imports torch)
#: the gpt workload's run settings: 8 windows of 64 bytes per replica and step, AdamW
GPT_SETTINGS = {"model": "gpt", "batch_rows": 8, "lr": 0.003}
#: each model's trainable parameter tensors (tests/demo checks them against the built models):
#: streaming_diloco cuts a model into at most this many fragments (fthsdp/sync/outer.py fragments_of)
TRAINABLE_TENSORS = {"mlp": 4, "gpt": 28}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fthsdp demo", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=flags.DefaultsFormatter)
    flags.add_version(p)
    p.add_argument("--model", choices=MODELS, default="mlp",
                   help="mlp: digits, replicated; gpt: a small transformer on text, sharded with FSDP2")
    p.add_argument("--replicas", type=int, default=4, help="data-parallel replicas (2..8)")
    p.add_argument("--ranks-per-replica", type=int, choices=(1, 2),
                   help="trainer processes per replica (default: 1 for mlp, 2 for gpt)")
    p.add_argument("--steps", type=int, default=200, help="training steps (10..5000)")
    p.add_argument("--failures", help="KIND@STEP:REPLICA,... with KIND kill-trainer, kill-agent, hang-trainer, or a "
                                      "host that goes bad for the diagnosis to find and evict: hang, stall, slow, "
                                      "sdc; '' for none (default: kill-trainer at 25%% of the steps on r1, kill-agent "
                                      "at 65%% on r2; with 200 steps kill-trainer@50:r1,kill-agent@130:r2)")
    p.add_argument("--spares", type=int, default=1, help="spare hosts (agents with --spare)")
    p.add_argument("--cold-spares", action="store_true", help="spares without pre-started standby trainers")
    p.add_argument("--warm-restarts", action="store_true",
                   help="agents keep a pre-started standby next to each trainer: a restarted rank starts warm")
    p.add_argument("--lr-policy", choices=LR_POLICIES, default="sqrt",
                   help="how the controller scales the learning rate with healthy/total replicas")
    p.add_argument("--heartbeat-timeout-s", type=float, default=3.0, help="the controller's detection bound")
    p.add_argument("--step-time-s", type=float, default=0.1,
                   help="shortest step: the rest is slept, standing in for accelerator time")
    p.add_argument("--out", type=Path, default=Path("fthsdp-report"),
                   help="directory for the report, its plots, and the runs' logs and records")
    p.add_argument("--seed", type=int, default=0, help="seeds the model and the data order")
    p.add_argument("--no-baseline", action="store_true", help="skip the no-failure baseline run")
    p.add_argument("--timeout-s", type=float, default=150.0, help="longest one run may take")
    p.add_argument("--sync", choices=SYNC_MODES, default="sync",
                   help="how replicas meet: every step (sync), or every --sync-every training steps (local_sgd: "
                        "parameters averaged; diloco: an outer Nesterov SGD step on the averaged pseudo-gradient)")
    p.add_argument("--sync-every", type=int, metavar="H",
                   help="training steps between two syncs (default: 1 with --sync sync, 8 otherwise)")
    p.add_argument("--outer-lr", type=float, help="diloco's outer learning rate (default: the runtime's, 0.7)")
    p.add_argument("--outer-momentum", type=float,
                   help="diloco's outer Nesterov momentum (default: the runtime's, 0.9)")
    p.add_argument("--sync-fragments", type=int, default=1, metavar="F",
                   help="streaming_diloco: fragments synced on staggered schedules, each every H training steps, "
                        "one every H / F (FTHSDP_SYNC_FRAGMENTS; H a multiple of F)")
    p.add_argument("--diagnosis-dry-run", action="store_true",
                   help="the controller's diagnosis only reports what it would evict (a hung host then stays "
                        "hung: use it with slow or sdc)")
    return p


def _check(args) -> None:
    if not 2 <= args.replicas <= 8:
        raise ValueError(f"--replicas must be between 2 and 8, got {args.replicas}.")
    if not 10 <= args.steps <= 5000:
        raise ValueError(f"--steps must be between 10 and 5000, got {args.steps}.")
    if not 0 <= args.spares <= 4:
        raise ValueError(f"--spares must be between 0 and 4, got {args.spares}.")
    if not 0.5 <= args.heartbeat_timeout_s <= 60:
        raise ValueError(f"--heartbeat-timeout-s must be between 0.5 and 60, got {args.heartbeat_timeout_s}.")
    if not 0 <= args.step_time_s <= 10:
        raise ValueError(f"--step-time-s must be between 0 and 10, got {args.step_time_s}.")
    if args.timeout_s <= 0:
        raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}.")
    _check_sync(args)


def _check_sync(args) -> None:
    """The mode's flags: H, the outer optimizer's and the fragments' only where the mode uses them."""
    if args.sync_every is None:
        args.sync_every = 1 if args.sync == "sync" else 8
    if args.sync == "sync" and args.sync_every != 1:
        raise ValueError(f"--sync-every {args.sync_every} needs --sync local_sgd or diloco "
                         f"(--sync sync meets every step).")
    if not 1 <= args.sync_every <= args.steps:
        raise ValueError(f"--sync-every must be between 1 and --steps ({args.steps}), got {args.sync_every}.")
    outer = [name for name, value in (("--outer-lr", args.outer_lr), ("--outer-momentum", args.outer_momentum))
             if value is not None]
    if outer and "diloco" not in args.sync:
        raise ValueError(f"{' and '.join(outer)} {'needs' if len(outer) == 1 else 'need'} --sync diloco "
                         f"(the outer optimizer), got --sync {args.sync}.")
    if args.outer_lr is not None and not (math.isfinite(args.outer_lr) and args.outer_lr > 0):
        raise ValueError(f"--outer-lr must be a finite number > 0, got {args.outer_lr}.")
    if args.outer_momentum is not None and not 0 <= args.outer_momentum < 1:
        raise ValueError(f"--outer-momentum must be in [0, 1), got {args.outer_momentum}.")
    if args.sync_fragments < 1:
        raise ValueError(f"--sync-fragments must be >= 1, got {args.sync_fragments}.")
    if args.sync_fragments > 1 and args.sync != "streaming_diloco":
        raise ValueError(f"--sync-fragments {args.sync_fragments} needs --sync streaming_diloco, "
                         f"got --sync {args.sync}.")
    if args.sync_fragments > TRAINABLE_TENSORS[args.model]:
        raise ValueError(f"--sync-fragments {args.sync_fragments} is more than the {args.model} model's "
                         f"{TRAINABLE_TENSORS[args.model]} parameter tensors (a fragment holds at least one); "
                         f"give at most {TRAINABLE_TENSORS[args.model]}.")
    if args.sync_every % args.sync_fragments:
        raise ValueError(f"--sync-every {args.sync_every} must be a multiple of --sync-fragments "
                         f"{args.sync_fragments} (each fragment syncs once per H training steps, one every H / F).")


def _check_failures(failures, sync: str) -> None:
    """The diagnosis judges hosts by their steps' collectives: its faults run with --sync sync only."""
    diagnosed = [f.describe() for f in failures if f.kind in DIAGNOSED]
    if diagnosed and sync != "sync":
        raise ScheduleError(f"failure {diagnosed[0]!r} is a host for the diagnosis to find, which the demo runs with "
                            f"--sync sync only (got --sync {sync}); use kill-trainer, kill-agent or hang-trainer.")


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.ranks_per_replica is None:
        args.ranks_per_replica = 2 if args.model == "gpt" else 1
    try:
        _check(args)
        text = args.failures if args.failures is not None else default_text(
            replicas=args.replicas, steps=args.steps, spares=args.spares,
            every=steps_per_sync(args.sync_every, args.sync_fragments))
        failures = parse(text, replicas=args.replicas, steps=args.steps, spares=args.spares)
        _check_failures(failures, args.sync)
    except ScheduleError as exc:
        print(f"fthsdp demo: bad --failures: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"fthsdp demo: {exc}", file=sys.stderr)
        return 2

    from fthsdp.demo import data, plots, report, run, schedule
    from fthsdp.demo.schedule import replica_ids

    settings = run.RunSettings(
        replicas=args.replicas, ranks_per_replica=args.ranks_per_replica, steps=args.steps, seed=args.seed,
        lr_policy=args.lr_policy, spares=args.spares, standby=not args.cold_spares, warm_restarts=args.warm_restarts,
        heartbeat_timeout_s=args.heartbeat_timeout_s, timeout_s=args.timeout_s, min_step_s=args.step_time_s,
        diagnosis_dry_run=args.diagnosis_dry_run, sync_mode=args.sync, sync_every=args.sync_every,
        outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, sync_fragments=args.sync_fragments,
        **GPT_SETTINGS if args.model == "gpt" else {})
    # a run ends at a sync: the protocol's steps are syncs of K training steps (H, or H / F streaming)
    k = settings.steps_per_sync
    settings = replace(settings, steps=-(-args.steps // k))
    broken = timeout_rules.check(settings.timeout_values())
    if broken:  # the demo runs every process: every rule of the timeout hierarchy applies
        print(f"fthsdp demo: {' '.join(v.message() for v in broken)}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    # the gpt workload reads its text from Python's own documentation topics (pydoc_data)
    dataset = data.prepare(out / "digits.npz", args.seed) if args.model == "mlp" else out / "no-data"
    print(f"demo: {args.replicas} replicas x {args.ranks_per_replica} rank(s), {settings.describe_steps()}, "
          f"failures: {', '.join(f.describe() for f in failures) or 'none'}; output in {out}", flush=True)
    if settings.semi_synchronous:
        print(f"demo: mode {settings.describe_mode()}; failures: "
              f"{'; '.join(f'{f.describe()} {schedule.moment(f.at_step, k)}' for f in failures) or 'none'}", flush=True)
    main_run = run.run_job(out / "run", dataset, settings, failures, tty=sys.stdout.isatty())
    if main_run.error:
        print(f"demo: the run failed: {main_run.error}", file=sys.stderr)
    ids = replica_ids(args.replicas)
    main_summary = report.summary(main_run.rows, ids, args.ranks_per_replica, settings.batch_rows,
                                  main_run.injections, k)
    base_summary, base_run = None, None
    if not args.no_baseline:
        # The paper compares at equal tokens: the baseline trains until it has seen as many
        # samples as the run with failures did, so the difference is quality, not lost time.
        base_steps = max(-(-10 // k), report.baseline_steps_for(main_summary["samples_seen"], args.replicas,
                                                                settings.batch_rows * k))
        print(f"demo: baseline run to the same samples seen ({main_summary['samples_seen']}: "
              f"{replace(settings, steps=base_steps).describe_steps()}; same mode, seed and data order; "
              f"no failures, no agents)", flush=True)
        base_run = run.run_baseline(out / "baseline", dataset, replace(settings, steps=base_steps))
        if base_run.error:
            print(f"demo: the baseline failed: {base_run.error}", file=sys.stderr)
        base_summary = report.summary(base_run.rows, ids, args.ranks_per_replica, settings.batch_rows)
    main_losses = report.loss_by_samples(main_run.rows, settings.batch_rows)
    base_losses = base_run and report.loss_by_samples(base_run.rows, settings.batch_rows)
    window = max(10, k) * args.replicas * settings.batch_rows  # about the last 10 steps (or one sync)
    seen = main_summary["samples_seen"]
    result = report.build(
        settings={**asdict(settings), "failures": [f.describe() for f in failures]}, sync=settings.sync_view(),
        main=main_summary, injections=main_run.injections, events=main_run.events, diagnoses=main_run.diagnoses,
        wall_s=main_run.ended_at - main_run.started_at,
        detection_bound_s=settings.heartbeat_timeout_s + 1.5, baseline=base_summary,
        baseline_wall_s=base_run and base_run.ended_at - base_run.started_at,
        band=report.band_view(report.load_band(report.band_path(args.sync, args.sync_every, args.sync_fragments)),
                              {**asdict(settings), "steps": args.steps}),
        loss_window=base_losses and {"samples": [max(seen - window, 0), seen],
                                     "run": report.mean_loss_near(main_losses, seen, window),
                                     "baseline": report.mean_loss_near(base_losses, seen, window)})
    result["checks"]["run_finished"] = not main_run.error and (base_run is None or not base_run.error)
    result["checks"]["all_failures_injected"] = not main_run.skipped
    result["skipped_failures"] = main_run.skipped
    result["total_wall_s"] = round(time.time() - t0, 2)
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    samples = report.samples_by_step(main_run.rows, settings.batch_rows)
    plots.loss_plot(out / "loss.png", main_losses, base_losses,
                    [dict(i, samples=samples.get(i["injected_step"], 0)) for i in main_run.injections])
    plots.healthy_plot(out / "healthy_replicas.png", main_run.samples, args.replicas, main_run.injections,
                       main_run.started_at)
    _print_summary(result, out)
    return 0 if report.passed(result) else 1


def _print_summary(r: dict, out: Path) -> None:
    sync = r["sync"]
    steps = f"{r['steps']} steps" if sync["mode"] == "sync" else \
        f"{r['steps']} syncs ({r['steps'] * sync['steps_per_sync']} training steps)"
    print(f"demo: mode {sync['text']}: {steps} in {r['wall_s']:.1f}s; effective training time "
          f"{r['effective_training_time']:.1%}; test accuracy {r['final']['test_accuracy']}")
    for f in r["failures"]:
        at = f"training step {f['training_step']} {f['moment']}" if f.get("moment") else f"step {f['injected_step']}"
        print(f"demo: {f['kind']} {f['replica']} at {at}: detected after "
              f"{f['detection_s']}s, healthy again after {f['rejoin_s']}s")
        if f.get("landed"):
            print(f"demo:   landed {f['landed']}")
        d = f.get("diagnosis")
        if d is not None:
            print(f"demo:   diagnosis: {d['finding'] or 'not found'}" + (
                f" (confidence {d['confidence']}, after {d['found_s']}s); {d['action']}: {d['action_reason']}"
                if d["found"] else ""))
    if r["baseline"]:
        comparison = r["comparison"]
        print(f"demo: baseline test accuracy {r['baseline']['test_accuracy']} "
              f"(difference {r['accuracy_difference']})")
        if comparison.get("statement"):
            print(f"demo: {comparison['statement']}")
    h = r.get("history")
    if h and h["abandoned_commits"]:  # information: a rollback or a roll-forward, not a problem
        print(f"demo: committed history: {h['steps']} steps; {h['abandoned_commits']} commit(s) of steps "
              f"{h['abandoned_steps']} left behind on {h['abandoned_branches']} abandoned branch(es)")
    print(f"demo: checks {json.dumps(r['checks'])}")
    for p in r["problems"]:
        print(f"demo: problem: {p}")
    print(f"demo: report in {out / 'report.json'}", flush=True)
