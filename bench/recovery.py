"""Downtime per failure on real processes: what the paper's headline is about, measured.

    python -m bench.recovery --json [--step-s 0.5] [--cases kill-rank kill-host hang-rank] [--cold-restarts]
        [--production-timeouts]

Each case is one job of the demo (fthsdp/demo): a real controller, one agent per replica host
and one warm spare (its trainer pre-started in standby), 3 replicas x 2 ranks of the demo's
trainer (a real model, FTAR between replicas, the data ledger, catch-up from a live peer),
each step padded to `--step-s` to stand for accelerator time. Every agent runs with warm
restarts (`fthsdp demo --warm-restarts`, `fthsdp agent --warm-restarts`): next to each trainer
a pre-started reserve standby (imports done) takes the rank when its replica restarts, so a
restart does not pay python + torch imports + model set-up again; `--cold-restarts` measures
without them (each restarted rank is a fresh process). Once every replica is HEALTHY
at the failure step, one failure hits replica r1:

- kill-rank: SIGKILL of r1's rank-0 trainer (its agent sees the exit, the controller restarts
  the replica there: both ranks are handed to the reserves);
- kill-host: SIGKILL of r1's agent and every trainer under it (the host is gone: the
  controller notices the silence and gives the warm spare r1's assignment; often the hang
  analysis is first, `detected_by` "host": the dead ranks' last telemetry shows them inside a
  collective that never completes);
- hang-rank: SIGSTOP of r1's last rank (alive and silent: no exit for an agent to see). The
  controller's hang analysis (controller/core/diagnosis: r1's rank never joined the collective
  its peers wait in) evicts r1's host after `hang_after_s`; its agent stops the trainers (a
  SIGCONT lets the stopped one act on its SIGTERM), which ends the survivors' FTAR step at once:
  they retry without r1, and the warm spare takes r1's work (`detected_by` "host": the
  eviction); docs/operations.md says what each part costs. With the
  diagnosis disabled only timeouts would find it, and r1 would not come back (then `found_by`
  says so).

From the trainers' own commit records and the controller's events (one machine, one clock):

- `survivor_stall_s`: failure -> the next commit of every surviving replica (the slowest);
  `step_period_s` beside it is the survivors' median time between commits before the failure
  (a commit that comes within one period lost nothing);
- `replica_down_s`: failure -> r1's first commit that trained (not its zero-gradient catch-up
  step); null if it did not come back before the run ended;
- `lost_replica_s`: effective training time lost, in replica-seconds: over the window from the
  failure to r1's return (or the end), each replica's window minus its trained commits times
  the step period, summed over replicas;
- `detected_by`/`detection_s`: the cause and time of the controller's DEAD event for r1;
- `split_rounds`: rounds after the failure that closed without a survivor which had joined
  before that round committed, so that it caught up a step instead of training it (issue 28's
  race 7: survivors a few ms apart closing a round without each other); 0 when the round
  waits its moment for the others (`survivor_catch_ups` counts every catch-up of a survivor,
  whatever its cause).

`--production-timeouts` runs the controller at its own defaults (ControllerSettings: join
timeout 5 s, heartbeat timeout 10 s, the diagnosis' defaults) instead of the demo's quick ones
(1 s, 3 s, hang_after_s 2 s): what a job gets without tuning. A kill-host there shows detection
from connections (controller/core/suspects.py): the dead leader's reset connection makes r1
suspect at once, so the survivors' round closes in a step, not after the heartbeat timeout.

The paper's figures for comparison (`paper_downtime_s`): 180 s per failure with FT-HSDP, 90 s
after its fixes (the synchronous baseline restarts the whole job: about 600 s).

One JSON line per case (FIELDS): case, failure, target (what was hit), the figures above (null
where a moment never came), window_s (the window lost_replica_s counts over), rejoin_s (failure
-> r1 HEALTHY again), survivor_retry_reason, and the run's settings: replicas,
ranks_per_replica, step_s, warm_spare, warm_restarts, join_timeout_s, heartbeat_timeout_s,
paper_downtime_s. A case whose failure was never injected prints `error` instead of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from controller.settings import ControllerSettings

from fthsdp.demo import data, report, run
from fthsdp.demo.schedule import Failure

CASES = {"kill-rank": "kill-trainer", "kill-host": "kill-agent", "hang-rank": "hang-trainer"}
PAPER_DOWNTIME_S = (180.0, 90.0)
FAILED = "r1"
#: how long a case may watch the job after the failure before it gives up on a return
AFTER_FAILURE_S = 40.0
#: the fields of each JSON line (`python -m bench.recovery --json`) and their types
FIELDS = {"case": str, "failure": str, "step_period_s": float, "survivor_stall_s": float | None,
          "replica_down_s": float | None, "lost_replica_s": float, "window_s": float, "survivor_catch_ups": int,
          "split_rounds": int, "detected_by": str | None, "detection_s": float | None, "rejoin_s": float | None,
          "target": str, "survivor_retry_reason": str | None, "replicas": int, "ranks_per_replica": int,
          "step_s": float, "warm_spare": bool, "warm_restarts": bool, "paper_downtime_s": list[float],
          "join_timeout_s": float, "heartbeat_timeout_s": float}


def settings(step_s: float, steps: int, timeout_s: float, warm_restarts: bool = True,
             production: bool = False) -> run.RunSettings:
    s = run.RunSettings(replicas=3, ranks_per_replica=2, steps=steps, seed=0, lr_policy="sqrt", spares=1,
                        standby=True, warm_restarts=warm_restarts, min_step_s=step_s, timeout_s=timeout_s)
    if production:
        defaults = ControllerSettings()
        s = replace(s, join_timeout_s=defaults.join_timeout_s, heartbeat_timeout_s=defaults.heartbeat_timeout_s,
                    demo_diagnosis=False)
    return s


def commits(rows: list[dict], replica: str) -> list[dict]:
    return [r for r in report.leader_rows(rows, "commit") if r["replica"] == replica]


def measure_rows(rows: list[dict], injected_at: float, replicas: list[str], failed: str) -> dict:
    """The case's numbers from its commit records (pure: tested on made-up rows)."""
    survivors = [r for r in replicas if r != failed]
    before = [[c["t"] for c in commits(rows, s) if c["t"] < injected_at] for s in survivors]
    gaps = [b - a for times in before for a, b in zip(times, times[1:])]
    period = statistics.median(gaps) if gaps else 0.0
    nexts = [next((c["t"] for c in commits(rows, s) if c["t"] > injected_at), None) for s in survivors]
    stall = None if None in nexts or not nexts else max(nexts) - injected_at
    back = next((c["t"] for c in commits(rows, failed) if c["t"] > injected_at and not c["behind"]), None)
    end = back if back is not None else max((r["t"] for r in rows), default=injected_at)
    lost = 0.0
    for replica in replicas:
        trained = sum(1 for c in commits(rows, replica) if injected_at < c["t"] <= end and not c["behind"])
        lost += max((end - injected_at) - trained * period, 0.0)
    catch_ups, split = split_rounds(rows, injected_at, survivors)
    return {"step_period_s": round(period, 3), "survivor_stall_s": None if stall is None else round(stall, 3),
            "replica_down_s": None if back is None else round(back - injected_at, 3),
            "lost_replica_s": round(lost, 2), "window_s": round(end - injected_at, 2),
            "survivor_catch_ups": catch_ups, "split_rounds": split}


def split_rounds(rows: list[dict], injected_at: float, survivors: list[str]) -> tuple[int, int]:
    """(catch-ups of survivors after the failure, those of them a split round caused): a
    survivor's catch-up commit whose step began before the commit of the round it missed (the
    other survivors' commit of the step before) -- it had joined a moment after that round closed."""
    done = {s: {c["step"]: c["t"] for c in commits(rows, s)} for s in survivors}
    catch_ups = split = 0
    for s in survivors:
        for c in commits(rows, s):
            if c["t"] <= injected_at or not c["behind"]:
                continue
            catch_ups += 1
            missed = [done[o][c["step"] - 1] for o in survivors if o != s and c["step"] - 1 in done[o]]
            split += bool(missed) and c["began"] < max(missed)
    return catch_ups, split


def run_case(case: str, s: run.RunSettings, workdir: Path, dataset: Path) -> dict:
    failure = Failure(CASES[case], at_step=max(3, s.steps // 3), replica=FAILED)
    with contextlib.redirect_stdout(sys.stderr):  # the demo's progress lines; stdout carries JSON only
        result = run.run_job(workdir / case, dataset, s, [failure], tty=False)
    out: dict = {"case": case, "failure": CASES[case]}
    if not result.injections:
        return {**out, "error": result.error or "the failure was never injected"}
    injection = result.injections[0]
    found = report.recovery(injection, result.events)
    out.update(measure_rows(result.rows, injection["injected_at"], run.replica_ids(s.replicas), FAILED))
    out.update({"detected_by": found["detected_by"], "detection_s": found["detection_s"],
                "rejoin_s": found["rejoin_s"], "target": injection["target"]})
    retry = next((r for r in report.leader_rows(result.rows, "retry")
                  if r["replica"] != FAILED and r["t"] > injection["injected_at"]), None)
    out["survivor_retry_reason"] = retry["reason"] if retry else None  # why the survivors' step failed
    if found["detected_by"] is None:
        out["found_by"] = (f"timeouts only: no DEAD event for {FAILED} (its leader kept heartbeating); the "
                           f"survivors' failed step (survivor_retry_reason) and the join timeout left it out")
    if result.error and out["replica_down_s"] is not None:
        out["error"] = result.error
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--step-s", type=float, default=0.5, help="each step padded to this (stands for accelerator time)")
    p.add_argument("--steps", type=int, default=30, help="steps per job (the failure comes at a third of them)")
    p.add_argument("--workdir", help="keep the runs' logs and records here (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="one JSON line per case (the default output)")
    p.add_argument("--cold-restarts", action="store_true",
                   help="agents without warm restarts: a restarted rank is a fresh process")
    p.add_argument("--production-timeouts", action="store_true",
                   help="the controller at its default join/heartbeat timeouts and diagnosis, not the demo's quick ones")
    args = p.parse_args(argv)
    if not 0.05 <= args.step_s <= 30:
        p.error(f"--step-s must be 0.05..30, got {args.step_s}")
    if not 10 <= args.steps <= 10_000:
        p.error(f"--steps must be 10..10000, got {args.steps}")
    s = settings(args.step_s, args.steps, timeout_s=60.0 + args.steps * args.step_s + AFTER_FAILURE_S,
                 warm_restarts=not args.cold_restarts, production=args.production_timeouts)
    with tempfile.TemporaryDirectory(prefix="fthsdp-recovery-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        dataset = data.prepare(workdir / "digits.npz", s.seed)
        for case in args.cases:
            line = run_case(case, s, workdir, dataset)
            line.update({"replicas": s.replicas, "ranks_per_replica": s.ranks_per_replica, "step_s": s.min_step_s,
                         "warm_spare": s.standby,
                         "warm_restarts": s.warm_restarts, "paper_downtime_s": list(PAPER_DOWNTIME_S),
                         "join_timeout_s": s.join_timeout_s, "heartbeat_timeout_s": s.heartbeat_timeout_s})
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
