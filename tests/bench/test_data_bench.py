"""bench.data on tiny settings: it runs, alternates the two loaders, and prints its one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_data_prints_one_json_line_with_both_rates_and_the_resume_time():
    out = subprocess.run([sys.executable, "-m", "bench.data", "--json", "--workers", "2", "--batch-size", "8",
                          "--batches", "6", "--rounds", "2", "--samples", "256", "--features", "16",
                          "--resume-at", "40"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    (line,) = out.stdout.splitlines()
    result = json.loads(line)
    assert result["bench"] == "data" and result["workers"] == 2 and result["rounds"] == 2
    assert result["samples_per_s_fthsdp"] > 0 and result["samples_per_s_plain"] > 0
    assert abs(result["ratio"] - result["samples_per_s_fthsdp"] / result["samples_per_s_plain"]) < 0.01
    assert result["resume_s"] > 0 and result["seek_s"] > 0 and result["resume_at"] == 40


def test_bench_data_refuses_a_batch_larger_than_the_dataset():
    out = subprocess.run([sys.executable, "-m", "bench.data", "--samples", "4", "--batch-size", "8"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "samples >= batch size" in out.stderr
