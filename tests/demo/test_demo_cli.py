"""`fthsdp demo` as a subprocess: a small faulty run end to end, and bad input."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

FTHSDP = str(Path(sys.executable).with_name("fthsdp"))
HEARTBEAT_TIMEOUT_S = 2.0


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_demo_with_a_dead_host_and_a_killed_trainer(tmp_path):
    out = tmp_path / "report"
    # The host dies first (a warm spare takes over in seconds); the trainer kill waits until
    # every replica is healthy again, and its cold restart takes longest.
    proc = subprocess.run(
        [FTHSDP, "demo", "--replicas", "3", "--steps", "40", "--step-time-s", "0.15",
         "--failures", "kill-agent@5:r2,kill-trainer@12:r1", "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S),
         "--no-baseline", "--out", str(out), "--timeout-s", "150"],
        capture_output=True, text=True, timeout=190, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    report = json.loads((out / "report.json").read_text())
    assert all(report["checks"].values()), report["checks"]
    assert report["checks"]["exactly_once"] is True and report["checks"]["bitwise_identical"] is True
    assert report["steps"] >= 40 and report["baseline"] is None
    assert report["history"]["steps"] == report["steps"]  # one committed chain, step 0 to the end
    assert [(f["kind"], f["replica"]) for f in report["failures"]] == [("kill-agent", "r2"), ("kill-trainer", "r1")]
    for f in report["failures"]:
        assert 0 < f["detection_s"] <= f["detection_bound_s"] == HEARTBEAT_TIMEOUT_S + 1.5
        assert f["detection_s"] < f["rejoin_s"]
    assert report["failures"][0]["detected_by"] in ("host", "heartbeat")
    assert report["failures"][1]["detected_by"] == "trainer_exit"
    assert 0 < report["effective_training_time"] < 1
    assert 0.5 < report["final"]["test_accuracy"] <= 1 and report["final"]["test_loss"] > 0
    for name in ("loss.png", "healthy_replicas.png"):
        width, height = _png_size(out / name)
        assert width > 100 and height > 100
    assert "kill-agent r2: SIGKILL host" in proc.stdout


@pytest.mark.parametrize("failures, named", [
    ("kill-trainer@40:r1,explode@50:r2", "'explode@50:r2'"),
    ("kill-trainer@40:r7", "'kill-trainer@40:r7'"),
    ("kill-trainer@999:r1", "'kill-trainer@999:r1'"),
])
def test_bad_schedule_exits_2_naming_the_entry(tmp_path, failures, named):
    proc = subprocess.run([FTHSDP, "demo", "--failures", failures, "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2
    assert "bad --failures" in proc.stderr and named in proc.stderr
    assert not (tmp_path / "r").exists()
