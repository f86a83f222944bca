"""`fthsdp bench` (also `python -m bench`): how fault tolerance performs on this machine, in one
command, as tables comparable across clusters.

    fthsdp bench --quick --out bench-report        # a few minutes on 2 cores
    fthsdp bench --full --out bench-report         # the benchmarks at their own defaults
    fthsdp bench --compare OLD_DIR NEW_DIR         # the change of every figure between two reports

A suite runs existing benchmarks one after another, each as a user would (`python -m bench.X
--json ...`, its own processes, a job secret of its own), and checks every line it prints
against the fields the module declares (`FIELDS`, bench/common.py). Measured: quorum latency
(beside torchft's lighthouse when torchft is installed: `pip install 'fthsdp[bench]'`), FTAR
against Gloo per message size (with the plain TCP ring as the ceiling), the catch-up's GB/s
against this machine's loopback ceiling and the runtime's overhead against plain training
(bench.overhead), recovery from a killed rank, a killed host and a hung rank (bench.recovery:
stall and down time), and controller failover on etcd (bench.failover).

It writes to --out: `results.jsonl` (one line per result, each with the host, CPU count, load,
versions and git revision), `report.md` (the tables, which are printed too) and PNG plots
(bench/plots.py). Progress goes to stderr, a bar per benchmark; each benchmark's own stderr
goes to `logs/NAME.err`. Exit status 1 when a benchmark failed (its error is in the report).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench import report
from bench.common import fields_problems, load
from protos import cli_flags as flags

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    """One benchmark of a suite: `python -m bench.NAME --json ARGS`, expected to print `lines`
    JSON lines (the progress bar's length) within `timeout_s`."""
    bench: str
    args: tuple[str, ...]
    lines: int
    timeout_s: float = 900.0


_SIZES = ("1MiB", "4MiB", "16MiB", "64MiB")
SUITES: dict[str, tuple[Run, ...]] = {
    # a few minutes on 2 idle cores (its first runs, on 2 cores at load 12-26, took 12 minutes)
    "quick": (
        Run("quorum", ("--replicas", "2", "8", "16", "--rounds", "20"), 3),
        Run("ftar", ("--world", "2", "--sizes", *_SIZES, "--iters", "3", "--warmup", "1"), len(_SIZES)),
        Run("overhead", ("--steps", "6", "--warmup", "1", "--catchup-bytes", str(256 << 20), "--catchup-repeats",
                         "2", "--fanout-ranks", "256"), 1),
        Run("recovery", ("--cases", "kill-rank", "kill-host", "hang-rank", "--steps", "24", "--step-s", "0.4"), 3),
        Run("failover", ("--trials", "2", "--lease-ttl-s", "1"), 1),
    ),
    # the benchmarks at their own defaults (tens of minutes)
    "full": (
        Run("quorum", ("--replicas", "2", "8", "16", "64", "--rounds", "50"), 4, 1800.0),
        Run("limits", (), 1, 1800.0),
        Run("ftar", ("--world", "2", "4", "--sizes", *_SIZES, "256MiB"), 10, 3600.0),
        Run("overhead", (), 1, 1800.0),
        Run("recovery", (), 3, 1800.0),
        Run("failover", (), 1, 1800.0),
        Run("swap", (), 1, 1800.0),
    ),
    # the smallest sizes, for the test that runs the whole path (not in --help)
    "smoke": (
        Run("quorum", ("--replicas", "2", "3", "--rounds", "2"), 2, 300.0),
        Run("ftar", ("--world", "2", "--sizes", "64KiB", "256KiB", "--iters", "1", "--warmup", "0"), 2, 300.0),
    ),
}
#: what `--compare-torchft` adds to bench.quorum when torchft is installed
TORCHFT_FLAG = "--compare-torchft"


def parser() -> argparse.ArgumentParser:
    """The command line of `fthsdp bench` (and `python -m bench`)."""
    p = argparse.ArgumentParser(prog="fthsdp bench", formatter_class=flags.DefaultsFormatter, description="How fault tolerance performs on this machine: "
                                "quorum latency, FTAR vs Gloo, catch-up, recovery, failover and overhead, as tables, "
                                "plots and results.jsonl in --out (bench/suite.py says what each measures).")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", dest="suite", action="store_const", const="quick",
                       help="the quick suite (the default): a few minutes on 2 idle cores")
    which.add_argument("--full", dest="suite", action="store_const", const="full",
                       help="every benchmark at its own default size (tens of minutes)")
    which.add_argument("--suite", choices=sorted(SUITES),
                       help="a named suite (smoke: the tests' tiny run; default: quick)")
    which.add_argument("--compare", nargs=2, metavar=("OLD_DIR", "NEW_DIR"),
                       help="print the change of every figure between two reports (their results.jsonl; default: run a suite)")
    p.add_argument("--out", default="bench-report", help="the report's folder (default: bench-report)")
    flags.add_version(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.compare:
        try:
            old, new = (report.read_results(Path(d)) for d in args.compare)
        except ValueError as exc:
            p.error(str(exc))
        print(report.compare_text(report.compare(old, new), *args.compare))
        return 0
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        p.error(f"--out {args.out!r} is a file, not a folder")
    return run_suite(args.suite or "quick", out)


def run_suite(suite: str, out: Path) -> int:
    """Run `suite`'s benchmarks, write results.jsonl, report.md and the plots to `out`, print
    the tables; 0 when every benchmark gave all its lines, else 1."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rich.markup import escape

    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = environment()
    rows: list[dict] = []
    torchft = _torchft_missing()
    console = Console(stderr=True)
    console.print(f"fthsdp bench --suite {suite}: {env['host']}, {env['cpus']} CPUs, git {env['git']}; "
                  f"writing {out}/", markup=False)
    with open(out / "results.jsonl", "w") as results, \
            Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     TextColumn("{task.fields[note]}"), console=console) as progress:

        def keep(bench: str, row: dict) -> None:  # each line as it comes: a stopped run keeps what it measured
            rows.append({"bench": bench, "suite": suite, **environment_now(env), **row})
            results.write(json.dumps(rows[-1]) + "\n")
            results.flush()

        for spec in SUITES[suite]:
            args = spec.args + ((TORCHFT_FLAG,) if spec.bench == "quorum" and not torchft else ())
            task = progress.add_task(spec.bench, total=spec.lines, note="")
            got = run_one(spec, args, out / "logs" / f"{spec.bench}.err",
                          on_line=lambda _row, task=task: progress.advance(task))
            for row in got:
                keep(spec.bench, row)
            failed = [r["error"] for r in got if "error" in r]
            progress.update(task, note=f"[red]failed: {escape(failed[0][:60])}" if failed else "done")
            if not console.is_terminal:  # no live bars in a log: a line per benchmark instead
                console.print(f"{spec.bench}: {'failed: ' + failed[0] if failed else 'done'} "
                              f"({next(t for t in progress.tasks if t.id == task).elapsed:.0f} s)", markup=False)
            if spec.bench == "quorum" and torchft:
                keep("quorum", {"note": f"torchft's lighthouse not measured: {torchft}"})
    text = report.markdown(rows)
    plots = _plots(rows, out)
    (out / "report.md").write_text(text + "".join(f"\n![{p.stem}]({p.name})\n" for p in plots))
    print(text)
    return 1 if any("error" in r for r in rows) else 0


def run_one(spec: Run, args: tuple[str, ...], log: Path, on_line=lambda row: None) -> list[dict]:
    """The benchmark's results: {"result": line} for each JSON line it printed (checked against
    its FIELDS), or {"error": why} for a line that does not match, an exit status other than 0,
    fewer lines than expected, or the run outliving its timeout (it is then killed)."""
    fields = importlib.import_module(f"bench.{spec.bench}").FIELDS
    argv = [sys.executable, "-m", f"bench.{spec.bench}", "--json", *args]
    out: list[dict] = []
    with open(log, "w") as err:
        # its own process group: past its bound, the benchmark and the processes it started go together
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                text=True, env={**os.environ, "PYTHONPATH": _pythonpath()}, start_new_session=True)
        killed = threading.Event()
        timer = threading.Timer(spec.timeout_s, lambda: (killed.set(), _kill_group(proc)))  # every run is bounded
        timer.start()
        try:
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                row = json.loads(line)
                problems = fields_problems(row, fields)
                out.append({"error": f"a line does not match bench.{spec.bench}.FIELDS: {'; '.join(problems)}",
                            "line": row} if problems else {"result": row})
                on_line(row)
            code = proc.wait()
        finally:
            timer.cancel()
    if code != 0 or len(out) < spec.lines:
        why = (f"killed after its {spec.timeout_s:g} s bound" if killed.is_set() else f"exit status {code}" if code
               else f"{len(out)} of {spec.lines} lines")
        out.append({"error": f"{' '.join(argv[1:])}: {why}; its stderr ends: {_tail(log)}"})
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended meanwhile


def environment() -> dict:
    """What every results line carries about where it was measured (the load is added per line)."""
    versions = {"python": platform.python_version()}
    for package in ("fthsdp", "torch", "grpcio", "torchft"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"host": socket.gethostname(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "versions": versions, "git": git_revision()}


def environment_now(env: dict) -> dict:
    return {**env, "load": load(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def git_revision() -> str:
    """The checkout's commit ("+dirty" with uncommitted changes), or "unknown" outside git."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if rev.returncode:
        return "unknown"
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _torchft_missing() -> str:
    from bench.torchft_yardstick import missing

    return missing()


def _plots(rows: list[dict], out: Path) -> list[Path]:
    from bench import plots

    return plots.write_all(report.results_of(rows), out)


def _pythonpath() -> str:
    return os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH", "")])])


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(nothing)"
