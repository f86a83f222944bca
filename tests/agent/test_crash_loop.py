"""A crash loop before any committed step fails in seconds (issue 39, finding 3): a real `fthsdp
controller` with its default fail_after_s (300 s), real agents, and a trainer command that fails
at once as a user's script does when its configuration is missing. The job turns FAILED as soon
as every restart budget is spent (a bounded wait far below fail_after_s), the reason names the
trainer's exit code and the last line of its stderr, and every agent exits EXIT_JOB_FAILED.

Every wait is a condition with a bound; nothing asserts on wall-clock time."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agent.main import EXIT_JOB_FAILED
from controller.settings import ControllerSettings
from tests.agent.cluster import Cluster

pytestmark = pytest.mark.slow
#: far below the default fail_after_s: the job must not wait for it
BOUND_S = 60
MISSING_CONFIG = (sys.executable, "-c", "raise RuntimeError('config file train.yaml not found')")


async def test_a_crash_loop_fails_in_seconds_naming_its_cause(tmp_path):
    assert ControllerSettings().fail_after_s >= 5 * BOUND_S  # the default applies: no --fail-after-s below
    c = Cluster(tmp_path)
    try:
        await c.start_controller(2, 1)  # a host's second trainer death spends its restart budget
        # a warm spare first: it takes the first crashed host's work and crashes alike
        agents = [await c.start_agent("s0", spare=True, command=MISSING_CONFIG)]
        agents += [await c.start_agent(f"h{i}", replica=f"r{i}", command=MISSING_CONFIG) for i in range(2)]
        codes = await asyncio.wait_for(asyncio.gather(*(a.proc.wait() for a in agents)), BOUND_S)
        assert codes == [EXIT_JOB_FAILED] * 3, [a.log()[-2000:] for a in agents]
        job = await c.get("/api/v1/job")
        assert job["job_state"] == "FAILED"
        cause = "exit code 1: RuntimeError: config file train.yaml not found"
        assert job["job_state_reason"].startswith(
            f"crash loop before any committed step: every replica's trainers died of the same cause ({cause})")
        [failed] = await c.events("job_failed")
        assert failed["message"] == f'job "job" FAILED: {job["job_state_reason"]}'
        assert not await c.events("job_stuck")  # it never waited out fail_after_s
        replicas = await c.get("/api/v1/replicas")
        assert [(r["replica_id"], r["state"]) for r in replicas] == [("r0", "DEAD"), ("r1", "DEAD")]
        hosts = {h["host_id"]: h for h in await c.get("/api/v1/hosts")}
        assert sum(h["cordoned"] for h in hosts.values()) == 3  # every budget was spent: the spare's too
        assert "SPARE" not in {h["state"] for h in hosts.values()}
        for a in agents:
            assert "the job FAILED" in a.log()
    finally:
        await c.close()
