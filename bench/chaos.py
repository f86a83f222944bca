"""Seeded chaos over a real job: random faults on real processes, invariants checked after each run.

    python -m bench.chaos --seeds 1-50 --json [--faults 4] [--keep DIR]
    python -m bench.chaos --network --seeds 41-60 --json      # network faults (root, iproute2, nftables)

Each seed is one job (3 replicas x 2 ranks, a warm spare, two controllers on a real etcd,
agents supervising the demo's trainers) with the seed's fault schedule (tests/chaos/
schedule.py) carried out by tests/chaos/executor.py and checked by tests/chaos/invariants.py.
Prints one JSON line per seed (FIELDS: seed, schedule, violations, faults, wall_s, injections,
trainer_errors, swaps, timeline, logs, and the invariants' numbers), then a summary line
(SUMMARY_FIELDS): seeds, violations (their total count), failed_seeds, faults_by_kind, faults,
wall_s. A seed's line explains itself (tests/chaos/explain.py): `trainer_errors` holds every
trainer traceback (at_s from the run's start, host, trainer, text, where it was raised, the
exception it was handling, the agent's word on the trainer after it), `swaps` every swap and
cordon with its reason, and `timeline` one short line per fault action, death, swap, cordon,
leader, rollback and trainer error, in order; `unexplained_moves` names each cordon or swap of
a host that no fault was aimed at (not a violation: a restart budget spent is replaced by
design), and such a seed keeps its logs as a failed one does. Exit status 1
when any seed has a violation. Runs go one after another (the machine has few cores);
their logs go to --keep (default: a temporary folder removed after each seed that passed).

--network runs each seed on a test network (tests/chaos/network.py: etcd, two controllers and
every host in network namespaces of their own, joined by a bridge) with the seed's network
faults instead (tests/chaos/net_kinds.py: a host partitioned, cut from its peers or from the
controllers, the leader cut from etcd, a lossy, a capped and a slow host, a host joining with its
clock skewed beyond or within the 300 s registration window; 2 replicas x 1 rank, each fault
lasting --fault-s); each seed's line carries `figures` per fault (time to exclude the cut
replica, its time back after healing, survivors' stall, steps it missed), and the skewed hosts'
outcomes as `skew_refused` (beyond the window: refused naming the skew, as expected) and
`skew_within_stayed`. Controllers check every caller's proof with the run's job secret.
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

from tests.chaos import explain, net_kinds
from tests.chaos.executor import ChaosRun
from tests.chaos.invariants import check
from tests.chaos.network import Network
from tests.chaos.schedule import ChaosSettings, make_schedule, parse_seeds

#: the fields of each seed's JSON line (`python -m bench.chaos --json`) and their types
FIELDS = {"seed": int, "schedule": list[str], "violations": list[str], "faults": dict, "wall_s": float,
          "injections": list[dict], "trainer_errors": list[dict], "swaps": list[dict], "timeline": list[str],
          "logs": str}
#: the fields of the last line, the summary
SUMMARY_FIELDS = {"summary": bool, "seeds": int, "violations": int, "failed_seeds": list[int], "faults_by_kind": dict,
                  "faults": int, "wall_s": float}


def run_seed(seed: int, settings: ChaosSettings, workdir: Path) -> dict:
    if isinstance(settings, net_kinds.NetSettings):
        return run_network_seed(seed, settings, workdir)
    schedule = make_schedule(seed, settings)
    recorded = ChaosRun(workdir, settings, schedule, seed).run()
    return _line(seed, schedule, recorded, check(recorded, settings))


def run_network_seed(seed: int, settings: "net_kinds.NetSettings", workdir: Path) -> dict:
    schedule = net_kinds.make_net_schedule(seed, settings)
    hosts = [f"h{i}" for i in range(settings.replicas)] + [f"spare{j}" for j in range(settings.spares)]
    with Network() as net:
        for name in ("etcd", "ca", "cb", *hosts):
            net.add(name)
        recorded = ChaosRun(workdir, settings, schedule, seed, net=net).run()
        faults = [r.to_json() for r in net.faults.records]
    line = _line(seed, schedule, recorded, check(recorded, settings), faults)
    line.update(figures=net_kinds.figures(recorded, settings), network_faults=faults)
    return line


def _line(seed: int, schedule, recorded, verdict, network_faults: list[dict] = ()) -> dict:
    return {"seed": seed, "schedule": [f.describe() for f in schedule], "violations": verdict.violations,
            **{k: val for k, val in verdict.stats.items() if k != "seed"},
            "injections": [{"kind": i.kind, "replicas": i.replicas, "hosts": i.hosts, "detail": i.detail,
                            "settle_s": None if i.settled_at is None else round(i.settled_at - i.at, 2),
                            **({"observed": i.observed} if i.observed else {})}
                           for i in recorded.injections],
            "trainer_errors": [_since(e.to_json(), recorded.started_at) for e in recorded.trainer_errors],
            "swaps": [_since(row, recorded.started_at) for row in explain.swaps(recorded.events)],
            "timeline": explain.timeline(recorded, recorded.trainer_errors, network_faults)}


def _since(row: dict, started_at: float) -> dict:
    """`row` with its epoch `at` as seconds from the run's start (the timeline's clock)."""
    at = row.pop("at")
    return {"at_s": None if at is None else round(at - started_at, 2), **row}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1-5", help="seeds to run: N, N-M or a comma-separated list of them")
    p.add_argument("--faults", type=int, help=f"faults per seed (default {ChaosSettings.faults}; with --network "
                                               f"{net_kinds.NetSettings.faults}, one of each network kind)")
    p.add_argument("--keep", type=Path, help="keep every seed's logs and records under this folder")
    p.add_argument("--json", action="store_true", help="JSON lines (the default output)")
    p.add_argument("--network", action="store_true",
                   help="network faults on a test network of namespaces (needs root, iproute2, nftables)")
    p.add_argument("--fault-s", type=float, nargs=2, metavar=("LOW", "HIGH"),
                   default=net_kinds.NetSettings.fault_s, help="--network: how long each fault lasts (seconds)")
    args = p.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        if args.network:
            settings = net_kinds.NetSettings(faults=net_kinds.NetSettings.faults if args.faults is None else args.faults,
                                             fault_s=tuple(args.fault_s)).validate()
        else:
            settings = replace(ChaosSettings(), faults=ChaosSettings.faults if args.faults is None else args.faults
                               ).validate()
    except ValueError as exc:
        p.error(str(exc))
    started = time.monotonic()
    kinds: Counter = Counter()
    figures: dict[str, dict[str, float]] = {}
    failed = []
    violations = 0
    for seed in seeds:
        base = args.keep or Path(tempfile.mkdtemp(prefix=f"fthsdp-chaos-{seed}-"))
        workdir = base / f"seed-{seed}"
        line = run_seed(seed, settings, workdir)
        kept = args.keep or line["violations"] or line.get("unexplained_moves")
        line["logs"] = str(workdir) if kept else ""
        print(json.dumps(line), flush=True)
        kinds.update(line["faults"])
        for row in line.get("figures", ()):
            worst = figures.setdefault(row["kind"], {})
            for name, value in row.items():
                if isinstance(value, (int, float)) and value is not None:
                    worst[f"{name}_max"] = max(worst.get(f"{name}_max", value), value)
        violations += len(line["violations"])
        if line["violations"]:
            failed.append(seed)
        if not kept:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"summary": True, "seeds": len(seeds), "violations": violations, "failed_seeds": failed,
                      "faults_by_kind": dict(sorted(kinds.items())), "faults": sum(kinds.values()),
                      **({"figures_by_kind": dict(sorted(figures.items()))} if figures else {}),
                      "wall_s": round(time.monotonic() - started, 1)}), flush=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
