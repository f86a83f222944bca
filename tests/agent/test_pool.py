"""A pool agent (`--on-job-complete pool`, the node pool's DaemonSet): when its job ends it stops
its trainers and stays; it serves the next job its controller address answers for (another job
id, running), and waits for it without giving up. Decisions as tables, then an Agent with real
trainer processes against the in-process fake controller."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.policy import gives_up_on_controller, serves_next_job
from agent.runner import Agent
from agent.settings import AgentSettings
from protos import controller_pb2 as pb
from tests.agent.fake_controller import FakeController
from tests.agent.helpers import alive, ready_files, trainer_command, wait_for


@pytest.mark.parametrize("setting, ended, answered, running, serves", [
    ("pool", "job-a", "job-b", True, True),
    ("pool", "job-a", "job-a", True, False),    # the ended job's own controller (or a standby of it)
    ("pool", "job-a", "job-b", False, False),   # the next job is already over: stay in the pool
    ("idle", "job-a", "job-b", True, False),
    ("exit", "job-a", "job-b", True, False),
])
def test_serves_next_job(setting, ended, answered, running, serves):
    assert serves_next_job(setting, ended, answered, running) is serves


@pytest.mark.parametrize("setting, serving, gives_up", [
    ("pool", True, True), ("pool", False, False), ("idle", False, True), ("exit", False, True),
])
def test_gives_up_on_controller(setting, serving, gives_up):
    assert gives_up_on_controller(setting, serving) is gives_up


def test_a_pool_agent_names_no_job():
    with pytest.raises(ValueError, match="on_job_complete 'pool' serves whichever job its controller address "
                                         "answers for: give no job_id \\(got 'j1'\\)"):
        AgentSettings(controller_addresses=("127.0.0.1:1",), host_id="h1", command=("t",), spare=True,
                      on_job_complete="pool", job_id="j1").validate()


async def test_a_pool_agent_serves_the_next_job_after_one_ends(controller, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="agent")
    controller.job_id = "job-a"
    now = [0.0]  # the agent's clock: its connect timeout is tested on it
    settings = AgentSettings(controller_addresses=(controller.address,), host_id="h1",
                             command=trainer_command(tmp_path), replica_id="r0", ranks=(0,), world_size=2,
                             heartbeat_interval_s=0.1, stop_grace_s=2.0, reconnect_base_s=0.05,
                             on_job_complete="pool", connect_timeout_s=5.0).validate()
    agent, stop = Agent(settings, clock=lambda: now[0]), asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    nxt = FakeController()
    try:
        [first] = await wait_for(lambda: ready_files(tmp_path), 10, "job-a's trainer ready")
        assert first["env"]["FTHSDP_JOB_ID"] == "job-a"
        controller.job_state = pb.COMPLETED
        await wait_for(lambda: not alive(first["pid"]), 10, "job-a's trainer stopped")
        assert not task.done() and agent.job_ending == "COMPLETED"

        # job-a's controller goes away (its Deployment deleted); the pool agent waits past its
        # connect timeout for the next job's controller, at the same address (the pool's Service)
        await controller.stop()
        await wait_for(lambda: "in the pool, waiting for a job's controller" in caplog.text, 10, "the agent waits")
        now[0] += 1000 * settings.connect_timeout_s
        nxt.job_id, nxt.answer = "job-b", pb.Assignment(replica_id="r1", ranks=[0], world_size=1)
        await nxt.start(port=int(controller.address.rsplit(":", 1)[1]))
        [second] = await wait_for(lambda: ready_files(tmp_path, "r1"), 10, "job-b's trainer ready")
        assert second["env"]["FTHSDP_JOB_ID"] == "job-b" and second["env"]["FTHSDP_REPLICA_ID"] == "r1"
        assert not task.done() and agent.job_ending == "" and "serving job job-b" in caplog.text
        # it came back with no claim of job-a's work: the next job lays its replicas out afresh
        assert not nxt.registrations[0].HasField("assignment")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        if nxt.server is not None:
            await nxt.stop()
