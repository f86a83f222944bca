"""A replica's process restarted near the job's end (torchrun --max-restarts; issue 39, finding
4), with real processes: a controller and one-rank replicas (tests/runtime/end_worker.py).

r1 finishes; r0 trains on alone, then its process dies (no finish, no goodbye) and a new
process of r0 starts, as torchrun's restart does, before the controller declared the old one
dead. Its join ends the old process, which completes the job (every other replica had
finished): the new process learns it from that first quorum and exits 3 (JobAlreadyCompleted),
instead of waiting out its quorum timeout and ending 0 as if it had trained. A process started
after that is refused at once too."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from fthsdp import EXIT_JOB_ALREADY_COMPLETED
from tests.runtime.cluster import PYTHON, REPO, start_controller
from tests.runtime.test_cluster_endings import base_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BOUND_S = 180


def _worker(ctl, replica: str, *args: str) -> subprocess.Popen:
    env = {**base_env(None), "FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_REPLICA_ID": replica, "FTHSDP_JOB_ID": "t",
           "FTHSDP_INSECURE_TRAINER_PORTS": "1"}
    return subprocess.Popen([PYTHON, "-m", "tests.runtime.end_worker", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_a_process_restarted_as_the_job_completes_learns_it_at_once_and_exits_3(tmp_path):
    # the first round waits for both replicas (however long their imports take), later ones for nobody
    ctl = start_controller(tmp_path / "controller.log", replicas=2, join_timeout_s=120.0, heartbeat_timeout_s=120.0)
    try:
        r1, r0 = _worker(ctl, "r1", "3"), _worker(ctl, "r0", "1000", "5")  # r0 dies after 5 commits
        assert r1.wait(BOUND_S) == 0, r1.stderr.read()[-3000:]
        assert r0.wait(BOUND_S) == 9, r0.stderr.read()[-3000:]
        replicas = {r["replica_id"]: r["state"] for r in httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5).json()}
        assert replicas["r1"] == "FINISHED" and replicas["r0"] != "DEAD"  # not declared dead yet: an early restart

        again = _worker(ctl, "r0", "1000")
        _, err = again.communicate(timeout=BOUND_S)
        assert again.returncode == EXIT_JOB_ALREADY_COMPLETED, err[-3000:]
        assert "started after the job COMPLETED and trained nothing" in err
        job = httpx.get(f"{ctl.http}/api/v1/job", timeout=5).json()
        replicas = {r["replica_id"]: r["state"] for r in httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5).json()}
        assert job["job_state"] == "COMPLETED" and replicas == {"r0": "DEAD", "r1": "FINISHED"}

        late = _worker(ctl, "r0", "1000")  # restarted once more, after the end
        _, err = late.communicate(timeout=BOUND_S)
        assert late.returncode == EXIT_JOB_ALREADY_COMPLETED, err[-3000:]
    finally:
        ctl.stop()
