"""bench.semisync at a tiny size: it starts the controller and the replicas, and prints one JSON line per
configuration with the bytes, the rate on its paced link, and the held-out loss at equal samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import semisync
from bench.common import fields_problems

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)  # two configurations, each a controller and two trainer processes (a loaded machine)
def test_bench_semisync_prints_one_line_per_configuration_and_diloco_sends_fewer_bytes():
    out = subprocess.run([sys.executable, "-m", "bench.semisync", "--json", "--steps", "8", "--hidden", "16",
                          "--features", "8", "--batch-size", "4", "--heldout", "64", "--configs", "diloco:4",
                          "--link-mb-s", "1000"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    sync, diloco = [json.loads(line) for line in out.stdout.splitlines()]
    assert fields_problems(sync, semisync.FIELDS) == fields_problems(diloco, semisync.FIELDS) == []
    assert (sync["mode"], sync["sync_every"], diloco["mode"], diloco["sync_every"]) == ("sync", 1, "diloco", 4)
    assert sync["commits"] == 8 and diloco["commits"] == 2  # one sync per 4 inner steps
    assert 0 < diloco["bytes_across_replicas_per_sample"] < 0.5 * sync["bytes_across_replicas_per_sample"]
    assert diloco["samples_per_s"] > 0 and "token bucket in the FTAR transport" in diloco["link"]
    assert diloco["replicas_agree"] and sync["replicas_agree"]  # one global model at the end
    assert diloco["heldout_loss_sync"] == sync["heldout_loss"] and "not run" in diloco["torchft"]


def test_bench_semisync_refuses_an_h_that_does_not_divide_the_steps():
    out = subprocess.run([sys.executable, "-m", "bench.semisync", "--steps", "10", "--configs", "diloco:4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "['diloco:4'] need" in out.stderr
