"""Seeded chaos over a real job: random faults on real processes, invariants checked after each run.

    python -m bench.chaos --seeds 1-50 --json [--faults 4] [--keep DIR]

Each seed is one job (3 replicas x 2 ranks, a warm spare, two controllers on a real etcd,
agents supervising the demo's trainers) with the seed's fault schedule (tests/chaos/
schedule.py) carried out by tests/chaos/executor.py and checked by tests/chaos/invariants.py.
Prints one JSON line per seed (FIELDS: seed, schedule, violations, faults, wall_s, injections,
logs, and the invariants' numbers), then a summary line (SUMMARY_FIELDS): seeds, violations
(their total count), failed_seeds, faults_by_kind, faults, wall_s. Exit status 1
when any seed has a violation. Runs go one after another (the machine has few cores);
their logs go to --keep (default: a temporary folder removed after each seed that passed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from tests.chaos.executor import ChaosRun
from tests.chaos.invariants import check
from tests.chaos.schedule import ChaosSettings, make_schedule, parse_seeds

#: the fields of each seed's JSON line (`python -m bench.chaos --json`) and their types
FIELDS = {"seed": int, "schedule": list[str], "violations": list[str], "faults": dict, "wall_s": float,
          "injections": list[dict], "logs": str}
#: the fields of the last line, the summary
SUMMARY_FIELDS = {"summary": bool, "seeds": int, "violations": int, "failed_seeds": list[int], "faults_by_kind": dict,
                  "faults": int, "wall_s": float}


def run_seed(seed: int, settings: ChaosSettings, workdir: Path) -> dict:
    schedule = make_schedule(seed, settings)
    recorded = ChaosRun(workdir, settings, schedule, seed).run()
    verdict = check(recorded, settings)
    return {"seed": seed, "schedule": [f.describe() for f in schedule], "violations": verdict.violations,
            **{k: val for k, val in verdict.stats.items() if k != "seed"},
            "injections": [{"kind": i.kind, "replicas": i.replicas, "hosts": i.hosts, "detail": i.detail,
                            "settle_s": None if i.settled_at is None else round(i.settled_at - i.at, 2)}
                           for i in recorded.injections]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1-5", help="seeds to run: N, N-M or a comma-separated list of them")
    p.add_argument("--faults", type=int, default=ChaosSettings.faults, help="faults per seed")
    p.add_argument("--keep", type=Path, help="keep every seed's logs and records under this folder")
    p.add_argument("--json", action="store_true", help="JSON lines (the default output)")
    args = p.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        settings = replace(ChaosSettings(), faults=args.faults).validate()
    except ValueError as exc:
        p.error(str(exc))
    started = time.monotonic()
    kinds: Counter = Counter()
    failed = []
    violations = 0
    for seed in seeds:
        base = args.keep or Path(tempfile.mkdtemp(prefix=f"fthsdp-chaos-{seed}-"))
        workdir = base / f"seed-{seed}"
        line = run_seed(seed, settings, workdir)
        line["logs"] = str(workdir) if args.keep or line["violations"] else ""
        print(json.dumps(line), flush=True)
        kinds.update(line["faults"])
        violations += len(line["violations"])
        if line["violations"]:
            failed.append(seed)
        elif not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"summary": True, "seeds": len(seeds), "violations": violations, "failed_seeds": failed,
                      "faults_by_kind": dict(sorted(kinds.items())), "faults": sum(kinds.values()),
                      "wall_s": round(time.monotonic() - started, 1)}), flush=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
