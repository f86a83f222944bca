"""Measure the baseline's seed-to-seed band once: the no-failure run for several seeds.

    python -m fthsdp.demo.band --seeds 0 1 2 3 4 --out /tmp/fthsdp-band [--write]

Runs the demo's baseline (controller plus trainers, no failures) with the default settings for
each seed, prints one JSON object with every seed's test accuracy and final training loss, and
with --write stores it as fthsdp/demo/baseline_band.json, which every report quotes beside its
difference to the baseline. A few minutes on 2 cores: too slow to repeat in every demo run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from fthsdp.demo import report

#: the configuration the band is measured for (the demo's defaults)
CONFIG = {"replicas": 4, "ranks_per_replica": 1, "steps": 200, "batch_rows": 32, "hidden": 32, "lr": 0.05,
          "lr_policy": "sqrt"}


def measure(seeds: list[int], out: Path) -> dict:
    from fthsdp.demo import data, run
    from fthsdp.demo.schedule import replica_ids

    accuracy, losses = [], []
    for seed in seeds:
        settings = run.RunSettings(replicas=CONFIG["replicas"], ranks_per_replica=CONFIG["ranks_per_replica"],
                                   steps=CONFIG["steps"], seed=seed, lr_policy=CONFIG["lr_policy"])
        assert {k: v for k, v in asdict(settings).items() if k in CONFIG} == CONFIG, "CONFIG and RunSettings differ"
        out.mkdir(parents=True, exist_ok=True)  # the run's folder is made anew: the data lies beside it
        result = run.run_baseline(out / f"seed-{seed}", data.prepare(out / f"digits-{seed}.npz", seed), settings)
        if result.error:
            raise RuntimeError(f"the baseline with seed {seed} failed: {result.error}")
        s = report.summary(result.rows, replica_ids(settings.replicas), settings.ranks_per_replica)
        accuracy.append(s["test_accuracy"])
        losses.append(s["final_train_loss"])
    return {"config": CONFIG, "seeds": seeds, "test_accuracy": accuracy, "final_train_loss": losses,
            "measured_with": f"python -m fthsdp.demo.band --seeds {' '.join(map(str, seeds))} --write"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=Path("fthsdp-band"))
    p.add_argument("--write", action="store_true", help=f"store the result as {report.BAND_FILE.name}")
    args = p.parse_args(argv)
    if len(set(args.seeds)) < 2:
        p.error(f"--seeds needs at least two different seeds, got {args.seeds}")
    band = measure(args.seeds, args.out.resolve())
    print(json.dumps(band), flush=True)
    if args.write:
        report.BAND_FILE.write_text(json.dumps(band, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
