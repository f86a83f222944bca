"""Every path ends clearly (issue 26), with a real controller and real agents (subprocesses on
loopback) and scripted trainers: a job that can no longer progress FAILS and its agents exit
non-zero; replicas outside the configured set are refused.

Every wait is a condition with a bound; nothing asserts on wall-clock time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from agent.main import EXIT_JOB_FAILED
from tests.agent.cluster import CLI, Cluster
from tests.agent.helpers import trainer_command, wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 60


async def exit_code(proc, bound_s: float = BOUND_S) -> int:
    return await asyncio.wait_for(proc.proc.wait(), bound_s)


async def test_a_crash_looping_job_without_spares_fails_and_its_agents_exit_non_zero(tmp_path):
    """Scenario 4: every replica crash-loops, both hosts are cordoned, no spare: the job FAILS
    (REST, status CLI, metrics, events) and the agents stop and exit EXIT_JOB_FAILED."""
    c = Cluster(tmp_path)
    try:
        await c.start_controller(2, 1, "--fail-after-s", "1")
        # two causes (exit codes 1 and 2): not a crash loop of one cause, which FAILS at once
        # (tests/agent/test_crash_loop.py), so the job waits --fail-after-s
        agents = [await c.start_agent(f"h{i}", replica=f"r{i}",
                                      command=trainer_command(c.ready_dir, "--exit", str(i + 1))) for i in range(2)]
        codes = [await exit_code(a) for a in agents]
        assert codes == [EXIT_JOB_FAILED, EXIT_JOB_FAILED]
        for a in agents:
            assert "the job is FAILED" in a.log() and "no replica can make progress" in a.log()
        job = await c.get("/api/v1/job")
        assert job["job_state"] == "FAILED" and job["failed_at"] is not None
        assert job["job_state_reason"].startswith(
            "no replica can make progress: all 2 are DEAD and wait on hosts that cannot run (r0 on host h0, "
            "r1 on host h1), and no spare is free for ")
        [failed] = await c.events("job_failed")
        assert failed["level"] == "error" and job["job_state_reason"] in failed["message"]
        assert await c.events("job_stuck")
        async with __import__("httpx").AsyncClient(base_url=c.http, timeout=10) as client:
            metrics = (await client.get("/metrics")).text
        assert 'fthsdp_job_failed{job_id="job"} 1.0' in metrics
        status = subprocess.run([*CLI, "status", "--url", c.http], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        assert 'job "job" FAILED' in status.stdout and "FAILED: no replica can make progress" in status.stdout
    finally:
        await c.close()


def test_an_agent_without_a_job_secret_refuses_to_start_naming_the_flags(tmp_path):
    """Scenario 5: no job secret and no --insecure: the agent stops at once (exit 2) and says
    which flags fix it, instead of starting trainers that crash and get the host cordoned."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_JOB_SECRET")
           and k != "FTHSDP_INSECURE_TRAINER_PORTS"}
    run = subprocess.run([*CLI, "agent", "--controller", "127.0.0.1:1", "--host-id", "h1", "--spare", "--",
                          *trainer_command(tmp_path)], capture_output=True, text=True, timeout=BOUND_S, env=env)
    assert run.returncode == 2
    assert "no job secret: give --job-secret-file PATH" in run.stderr and "or --insecure to run" in run.stderr
    assert not list(tmp_path.iterdir())  # no trainer started
