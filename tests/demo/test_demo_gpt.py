"""`fthsdp demo --model gpt`: the transformer on text, FSDP2 over 2 ranks per replica, a trainer killed.

A step takes at least 0.25 s, so the survivor trains on (alone, up to the demo's step cap) for
longer than a killed trainer takes to restart on a loaded machine.
"""

from __future__ import annotations

import pytest

from tests.demo.test_demo_cli import run_demo


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_gpt_demo_recovers_a_killed_sharded_trainer(tmp_path):
    _, report = run_demo(tmp_path / "report", "--model", "gpt", "--replicas", "2", "--steps", "20", "--step-time-s",
                         "0.25", "--failures", "kill-trainer@6:r1", "--spares", "0", "--heartbeat-timeout-s", "2",
                         "--no-baseline", "--timeout-s", "200", timeout_s=230)
    assert all(report["checks"].values()), report["checks"]
    assert report["settings"]["model"] == "gpt" and report["settings"]["ranks_per_replica"] == 2
    assert [(f["kind"], f["replica"], f["detected_by"]) for f in report["failures"]] == \
        [("kill-trainer", "r1", "trainer_exit")]
    assert report["final"]["test_loss"] < 5.5  # next-byte cross entropy below a uniform guess (ln 256)
    assert 0 < report["final"]["test_accuracy"] < 1
