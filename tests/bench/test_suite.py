"""`fthsdp bench` end to end at the smallest sizes (the hidden `--suite smoke`: quorum and FTAR
against Gloo), as a user runs it; and a benchmark that fails or outlives its bound is reported,
never waited on for ever."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import suite
from tests.bench.smoke import ROOT

BIN = os.path.dirname(sys.executable)


@pytest.mark.timeout(600)
def test_fthsdp_bench_writes_results_a_report_and_plots_then_compares_two_reports(tmp_path):
    out = tmp_path / "bench-report"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([os.path.join(BIN, "fthsdp"), "bench", "--suite", "smoke", "--out", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=540, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # the smoke runs of bench.quorum and bench.ftar (tests/bench/smoke.py): every line matched FIELDS
    assert [r for r in rows if "error" in r] == [] and {r["bench"] for r in rows if "result" in r} == {"quorum", "ftar"}
    for row in rows:
        assert row["host"] and row["cpus"] == os.cpu_count() and len(row["load"]) == 3 and row["git"], row
        assert row["versions"]["python"] and row["versions"]["torch"] and row["versions"]["fthsdp"], row
    text = (out / "report.md").read_text()
    assert "## FTAR vs Gloo all-reduce (`python -m bench.ftar`)" in text and "| 64KiB | 16384 | float | sum | 2 |" in text
    assert "## Quorum latency (`python -m bench.quorum`)" in text and "\n| 2 | " in text
    assert text.split("\n![")[0] in proc.stdout  # the tables are printed too (the plots' links are not)
    assert (out / "ftar_busbw.png").read_bytes()[:4] == b"\x89PNG" and (out / "quorum_latency.png").is_file()
    assert "quorum" in proc.stderr and "ftar" in proc.stderr  # the progress, a bar per benchmark
    if rows[0]["versions"]["torchft"] is None:
        assert "torchft's lighthouse not measured: torchft is not installed" in text

    again = subprocess.run([os.path.join(BIN, "fthsdp"), "bench", "--compare", str(out), str(out)], env=env,
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr
    assert "| ftar world=2 bytes=64KiB ftar_busbw_gbs |" in again.stdout and "| +0.0% | same |" in again.stdout
    assert " 0 better, 0 worse, 0 in one report only." in again.stdout


def test_a_benchmark_that_exits_with_an_error_is_reported_with_its_words(tmp_path):
    got = suite.run_one(suite.Run("swap", ("--trials", "0"), 1), ("--trials", "0"), tmp_path / "swap.err")
    assert len(got) == 1 and "exit status 2" in got[0]["error"] and "--trials must be >= 1" in got[0]["error"]


def test_a_benchmark_past_its_bound_is_killed_and_reported(tmp_path):
    spec = suite.Run("quorum", ("--replicas", "2", "--rounds", "100000"), 1, timeout_s=1.0)
    got = suite.run_one(spec, spec.args, tmp_path / "quorum.err")
    assert got[-1]["error"].startswith("-m bench.quorum --json --replicas 2 --rounds 100000: killed after its 1 s bound")
