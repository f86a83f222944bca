"""Measure a configuration's seed-to-seed band once: the no-failure run for several seeds.

    python -m fthsdp.demo.band --seeds 0 1 2 3 4 --out /tmp/fthsdp-band [--write]
    python -m fthsdp.demo.band --sync diloco --sync-every 8 --seeds 0 1 2 --write
    python -m fthsdp.demo.band --sync streaming_diloco --sync-every 8 --sync-fragments 2 --seeds 0 1 2 --write

Runs the demo's baseline (controller plus trainers, no failures) with the default settings for
each seed, in the mode given (every step by default), prints one JSON object with every seed's
test accuracy and final training loss, and with --write stores it where the report looks for
that mode, H and F (`report.band_path`: fthsdp/demo/baseline_band.json for the default mode,
baseline_band_<mode>_h<H>.json beside it otherwise, _f<F> added for streaming_diloco's F > 1
fragments), which every report of that configuration
quotes beside its difference to the baseline. A few minutes on 2 cores: too slow to repeat in
every demo run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from fthsdp.demo import report
from protos import sync_modes
from protos.sync_modes import SYNC_MODES

#: the configuration the band is measured for (the demo's defaults); "steps" counts training steps
CONFIG = {"replicas": 4, "ranks_per_replica": 1, "steps": 200, "batch_rows": 32, "hidden": 32, "lr": 0.05,
          "lr_policy": "sqrt"}


#: longest one seed's run may take (trainers start slowly on a loaded machine)
TIMEOUT_S = 900.0


def config(sync_mode: str = "sync", sync_every: int = 1, sync_fragments: int = 1) -> dict:
    """CONFIG in a mode (the default mode's band predates the mode and names none; F is named
    where it is more than 1)."""
    if sync_mode == "sync":
        return CONFIG
    fragments = {"sync_fragments": sync_fragments} if sync_fragments > 1 else {}
    return {**CONFIG, "sync_mode": sync_mode, "sync_every": sync_every, **fragments}


def measure(seeds: list[int], out: Path, sync_mode: str = "sync", sync_every: int = 1, sync_fragments: int = 1) -> dict:
    from fthsdp.demo import data, run
    from fthsdp.demo.schedule import replica_ids, steps_per_sync

    cfg = config(sync_mode, sync_every, sync_fragments)
    k = steps_per_sync(sync_every, sync_fragments)  # the training steps of one protocol step
    accuracy, losses = [], []
    for seed in seeds:
        settings = run.RunSettings(replicas=cfg["replicas"], ranks_per_replica=cfg["ranks_per_replica"],
                                   steps=-(-cfg["steps"] // k), seed=seed, lr_policy=cfg["lr_policy"],
                                   sync_mode=sync_mode, sync_every=sync_every, sync_fragments=sync_fragments,
                                   timeout_s=TIMEOUT_S)
        got = {**asdict(settings), "steps": cfg["steps"]}
        assert {k: v for k, v in got.items() if k in cfg} == cfg, "CONFIG and RunSettings differ"
        out.mkdir(parents=True, exist_ok=True)  # the run's folder is made anew: the data lies beside it
        result = run.run_baseline(out / f"seed-{seed}", data.prepare(out / f"digits-{seed}.npz", seed), settings)
        if result.error:
            raise RuntimeError(f"the baseline with seed {seed} failed: {result.error}")
        s = report.summary(result.rows, replica_ids(settings.replicas), settings.ranks_per_replica)
        accuracy.append(s["test_accuracy"])
        losses.append(s["final_train_loss"])
        print(f"band: seed {seed}: test accuracy {s['test_accuracy']}, final training loss {s['final_train_loss']}",
              file=sys.stderr, flush=True)
    mode = "" if sync_mode == "sync" else f"--sync {sync_mode} --sync-every {sync_every} "
    mode += f"--sync-fragments {sync_fragments} " if sync_fragments > 1 else ""
    return {"config": cfg, "seeds": seeds, "test_accuracy": accuracy, "final_train_loss": losses,
            "measured_with": f"python -m fthsdp.demo.band {mode}--seeds {' '.join(map(str, seeds))} --write"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=Path("fthsdp-band"))
    p.add_argument("--sync", choices=SYNC_MODES, default="sync", help="the mode, as `fthsdp demo --sync`")
    p.add_argument("--sync-every", type=int, metavar="H", help="as `fthsdp demo --sync-every` (default: 1 or 8)")
    p.add_argument("--sync-fragments", type=int, default=1, metavar="F",
                   help="as `fthsdp demo --sync-fragments` (streaming_diloco only)")
    p.add_argument("--write", action="store_true", help="store the result where the report looks for it")
    args = p.parse_args(argv)
    every = args.sync_every if args.sync_every is not None else 1 if args.sync == "sync" else 8
    if len(set(args.seeds)) < 2:
        p.error(f"--seeds needs at least two different seeds, got {args.seeds}")
    if (args.sync == "sync") != (every == 1) or not 1 <= every <= CONFIG["steps"]:
        p.error(f"--sync-every {every} does not fit --sync {args.sync} (1 for sync, 1..{CONFIG['steps']} otherwise)")
    problems = sync_modes.schedule_problems(args.sync, every, args.sync_fragments)
    if problems:
        p.error(" ".join(problems))
    band = measure(args.seeds, args.out.resolve(), args.sync, every, args.sync_fragments)
    print(json.dumps(band), flush=True)
    if args.write:
        report.band_path(args.sync, every, args.sync_fragments).write_text(json.dumps(band, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
