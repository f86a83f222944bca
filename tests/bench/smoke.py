"""The smoke run of every benchmark: `python -m bench.NAME --json` at its smallest size, as a user
runs it (a subprocess, the worktree on PYTHONPATH), its lines checked against the fields the
module declares (`FIELDS`; the last line against `SUMMARY_FIELDS` where a module ends with a
summary). One table, SMOKE, says how each is run and on which pytest worker group; the test
files run their group's rows, and test_smoke.py fails for a benchmark the table lacks.
(bench.goodput, bench.diagnosis, bench.data, bench.limits, bench.swap, bench.failover, bench.scale,
bench.ftar_gpu: test_smoke.py; bench.quorum, bench.ftar: test_suite.py; bench.overhead, bench.hsdp:
test_smoke_trainers.py; bench.recovery: test_smoke_jobs.py; bench.semisync, bench.chaos: their own
test files.)"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.common import fields_problems

ROOT = Path(__file__).resolve().parents[2]
LIGHT, TRAINERS, SOLO = "light", "trainers", "solo"
#: a benchmark whose own test file runs it and checks more than its fields (bench.semisync:
#: tests/bench/test_semisync_bench.py; bench.chaos: tests/chaos/test_chaos_run.py, the suite's
#: seed and its invariants); the smoke files do not run it again
OWN = "own"


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]
    #: LIGHT: beside other tests; TRAINERS: starts torch trainers (tests/scheduling.py's group);
    #: SOLO: a whole job of trainers, with the machine to itself
    group: str = LIGHT
    timeout_s: float = 300.0


SMOKE: dict[str, Smoke] = {
    "goodput": Smoke(("--horizon-h", "20")),
    "diagnosis": Smoke(("--ranks", "256", "--replicas", "4", "--faults", "8")),
    "data": Smoke(("--workers", "1", "--batch-size", "4", "--batches", "4", "--rounds", "1", "--samples", "64",
                   "--features", "8", "--resume-at", "20")),
    # bench.quorum and bench.ftar: `fthsdp bench --suite smoke` runs them (tests/bench/test_suite.py),
    # each line checked against FIELDS by the suite itself
    "quorum": Smoke(("--replicas", "2", "--rounds", "2"), OWN),
    "limits": Smoke(("--total", "4MiB", "--repeats", "1")),
    "ftar": Smoke(("--world", "2", "--sizes", "64KiB", "--iters", "1", "--warmup", "0"), OWN),
    "swap": Smoke(("--trials", "1", "--weights-mb", "1")),
    "failover": Smoke(("--trials", "1", "--lease-ttl-s", "1")),
    "scale": Smoke(("--replicas", "2", "--ranks-per-replica", "16", "--hosts-per-replica", "4", "--rounds", "2",
                    "--fanout-rounds", "1", "--step-s", "0.01")),
    "overhead": Smoke(("--replicas", "2", "--steps", "2", "--warmup", "1", "--hidden", "16", "--width", "8",
                       "--batch", "4", "--catchup-bytes", "1048576", "--catchup-repeats", "1", "--fanout-ranks", "4"),
                      TRAINERS, 600.0),
    "hsdp": Smoke(("--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--rows", "1", "--steps", "1",
                   "--warmup", "1", "--catchup-repeats", "1"), TRAINERS, 600.0),
    "recovery": Smoke(("--cases", "kill-rank", "--steps", "40", "--step-s", "0.25"), SOLO, 600.0),
    # the suite's fixed seed (tests/chaos/test_chaos_run.py: its faults need the most machinery)
    "chaos": Smoke(("--seeds", "17"), OWN, 900.0),
    # sync, diloco (and streaming diloco where the mode exists) on the veth link where the machine
    # allows, without torchft (tests must not need it)
    "semisync": Smoke(("--steps", "8", "--hidden", "16", "--features", "8", "--batch-size", "4", "--heldout", "64",
                       "--configs", "diloco:4,streaming_diloco:4:2", "--plan-ahead-steps", "1",
                       "--inner-optimizer", "adamw_fused",
                       "--link-mb-s", "1000", "--no-torchft"), OWN, 900.0),
    # GPU only: without a CUDA device it must refuse (test_smoke.py); with one, the smallest run
    "ftar_gpu": Smoke(("--world", "2", "--sizes", "1MiB", "--iters", "1", "--kernel-bytes", "1MiB",
                       "--runtime-layers", "1", "--runtime-d-model", "64"), LIGHT, 600.0),
}


def run(name: str, *args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """`python -m bench.NAME --json` with the row's arguments, then `args`."""
    return subprocess.run([sys.executable, "-m", f"bench.{name}", "--json", *SMOKE[name].args, *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=timeout_s or SMOKE[name].timeout_s, stdin=subprocess.DEVNULL)


def check(name: str, *args: str, ok_status: tuple[int, ...] = (0,)) -> list[dict]:
    """Run NAME's smoke (its row's arguments, then `args`); its lines, each checked against the
    module's declared fields. An exit status outside `ok_status` fails."""
    proc = run(name, *args)
    assert proc.returncode in ok_status, f"bench.{name} exited {proc.returncode}: {proc.stderr[-3000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"bench.{name} printed no JSON line: {proc.stderr[-3000:]}"
    module = importlib.import_module(f"bench.{name}")
    summary = getattr(module, "SUMMARY_FIELDS", None)
    for i, line in enumerate(lines):
        fields = summary if summary is not None and i == len(lines) - 1 else module.FIELDS
        problems = fields_problems(line, fields)
        assert not problems, f"bench.{name} line {i + 1} does not match its declared fields: {problems}\n{line}"
    return lines


def group(name: str) -> list[str]:
    return sorted(n for n, s in SMOKE.items() if s.group == name and n != "ftar_gpu")
