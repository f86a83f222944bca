"""After `Manager.close()` a trainer's process is the user's (issue 39, finding 2): once the job
COMPLETED, the agent lets it finish its own work (export, evaluation, upload) and exit on its
own for --finish-grace-s, shows it as finishing in REST, and stops it only after the grace.

Real processes: a controller, an agent, and its trainer (tests/runtime/closing_worker.py) that
trains, closes, and then waits for a file the test creates before it writes its output. The
policy's decision on a fake clock is in tests/agent/test_policy.py."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from tests.agent.cluster import Cluster
from tests.agent.helpers import alive
from tests.waiting import wait_for_async

BOUND_S = 120.0


@contextlib.asynccontextmanager
async def _job(tmp_path, grace_s: str):
    """One replica's job: a controller, and an agent whose trainer closes and then waits for
    tmp_path/go before it saves; the agent's --finish-grace-s is grace_s."""
    c = Cluster(tmp_path)
    try:
        await c.start_controller(replicas=1)
        command = (sys.executable, "-m", "tests.runtime.closing_worker", str(tmp_path), "3")
        yield c, await c.start_agent("h0", replica="r0", command=command, extra=("--finish-grace-s", grace_s))
    finally:
        await c.close()


async def test_a_trainers_work_after_close_finishes_and_it_exits_0_by_itself(tmp_path):
    async with _job(tmp_path, "300") as (c, agent):

        async def finishing() -> bool:
            host = await c.host("h0")
            return host["finishing_trainers"] == 1 and "finishing" in host["state_reason"]
        await wait_for_async(finishing, BOUND_S, "REST to show h0's trainer finishing after COMPLETED")
        assert (await c.get("/api/v1/job"))["job_state"] == "COMPLETED"
        assert not list(tmp_path.glob("saved-*.json"))  # its work after close still runs
        (tmp_path / "go").touch()
        assert await asyncio.wait_for(agent.proc.wait(), BOUND_S) == 0, agent.log()
        [saved] = list(tmp_path.glob("saved-*.json"))
        exits = [e["message"] for e in await c.events("finished")]
        assert any("exited with code 0" in m for m in exits), exits  # on its own, not stopped
        assert "did not exit within the finish grace" not in agent.log()


async def test_a_trainer_that_never_exits_after_close_is_stopped_after_the_grace(tmp_path):
    async with _job(tmp_path, "1") as (c, agent):
        assert await asyncio.wait_for(agent.proc.wait(), BOUND_S) == 0, agent.log()
        assert "did not exit within the finish grace" in agent.log()
        assert "closed" in agent.log()  # it had closed: its replica finished, the job COMPLETED
        assert not list(tmp_path.glob("saved-*.json"))
        pids = [int(line.split("started pid ")[1].split()[0]) for line in agent.log().splitlines()
                if "started pid " in line]
        assert pids and not any(alive(pid) for pid in pids)
