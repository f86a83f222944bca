"""A replica's process restarted near the job's end (torchrun --max-restarts; issue 39, finding
4), with real processes: a controller and one-rank replicas (tests/runtime/end_worker.py).

r1 finishes; r0 trains on alone, then its process dies (no finish, no goodbye) and a new
process of r0 starts, as torchrun's restart does, before the controller declared the old one
dead. Its join ends the old process, which completes the job (every other replica had
finished): the new process learns it from that first quorum and exits 3 (JobAlreadyCompleted),
instead of waiting out its quorum timeout and ending 0 as if it had trained. A process started
after that is refused at once too. Each process is forked from the test session's pre-imported
server (tests/forked.py): a real process with its own pid, environment and exit status, that
does not import torch again."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fthsdp import EXIT_JOB_ALREADY_COMPLETED
from tests import forked
from tests.runtime.cluster import REPO, start_controller
from tests.runtime.test_cluster_endings import base_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BOUND_S = 180


def _worker(ctl, log: Path, replica: str, *args: str) -> forked.Forked:
    """`python -m tests.runtime.end_worker *args` as replica `replica`; its stderr in `log`."""
    env = {**base_env(None), "FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_REPLICA_ID": replica, "FTHSDP_JOB_ID": "t",
           "FTHSDP_INSECURE_TRAINER_PORTS": "1"}
    return forked.start("tests.runtime.end_worker", list(args), log=log, env=env, cwd=REPO, pipes=False)


def test_a_process_restarted_as_the_job_completes_learns_it_at_once_and_exits_3(tmp_path):
    # the first round waits for both replicas (however long their imports take), later ones for nobody
    ctl = start_controller(tmp_path / "controller.log", replicas=2, join_timeout_s=120.0, heartbeat_timeout_s=120.0)
    logs = {name: tmp_path / f"{name}.log" for name in ("r1", "r0", "again", "late")}
    try:
        r1 = _worker(ctl, logs["r1"], "r1", "3")
        r0 = _worker(ctl, logs["r0"], "r0", "1000", "5")  # r0 dies after 5 commits
        assert r1.wait(BOUND_S) == 0, logs["r1"].read_text()[-3000:]
        assert r0.wait(BOUND_S) == 9, logs["r0"].read_text()[-3000:]
        replicas = {r["replica_id"]: r["state"] for r in httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5).json()}
        assert replicas["r1"] == "FINISHED" and replicas["r0"] != "DEAD"  # not declared dead yet: an early restart

        again = _worker(ctl, logs["again"], "r0", "1000")
        assert again.wait(BOUND_S) == EXIT_JOB_ALREADY_COMPLETED, logs["again"].read_text()[-3000:]
        assert "started after the job COMPLETED and trained nothing" in logs["again"].read_text()
        job = httpx.get(f"{ctl.http}/api/v1/job", timeout=5).json()
        replicas = {r["replica_id"]: r["state"] for r in httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5).json()}
        assert job["job_state"] == "COMPLETED" and replicas == {"r0": "DEAD", "r1": "FINISHED"}

        late = _worker(ctl, logs["late"], "r0", "1000")  # restarted once more, after the end
        assert late.wait(BOUND_S) == EXIT_JOB_ALREADY_COMPLETED, logs["late"].read_text()[-3000:]
    finally:
        ctl.stop()
