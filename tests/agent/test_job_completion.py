"""A finished trainer and a COMPLETED job, against the in-process fake controller with real
trainer processes: clean exits are done (no restart, no warning); COMPLETED stops trainers and
ends the agent, or idles it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.main import parse
from agent.policy import JobEnd, after_job_state
from agent.settings import AgentSettings
from protos import controller_pb2 as pb
from tests.agent.helpers import alive, ready_files, trainer_command, wait_for


@pytest.mark.parametrize("completed, setting, end", [
    (False, "exit", JobEnd.RUN), (False, "idle", JobEnd.RUN),
    (True, "exit", JobEnd.EXIT), (True, "idle", JobEnd.IDLE),
])
def test_after_job_state(completed, setting, end):
    assert after_job_state(completed, setting) is end


def test_on_job_complete_setting_and_flag():
    base = dict(controller_addresses=("127.0.0.1:1",), host_id="h1", command=("t",), spare=True)
    with pytest.raises(ValueError, match="on_job_complete must be one of exit, idle, pool, got 'linger'"):
        AgentSettings(**base, on_job_complete="linger").validate()
    assert parse(["--controller", "127.0.0.1:1", "--host-id", "h1", "--spare", "--", "t"]).on_job_complete == "exit"
    assert parse(["--controller", "127.0.0.1:1", "--host-id", "h1", "--spare", "--on-job-complete", "idle",
                  "--", "t"]).on_job_complete == "idle"


async def test_a_trainer_that_exits_0_is_done_and_completed_ends_the_agent(controller, start_agent, tmp_path,
                                                                          caplog):
    caplog.set_level(logging.INFO, logger="agent")
    run = start_agent([controller.address], command=trainer_command(tmp_path, "--exit", "0"),
                      ranks=(0, 1), restart_budget=3)
    exits = await wait_for(lambda: len(controller.exits) == 2 and controller.exits, 10, "two clean exits")
    assert sorted((e.rank, e.exit_code, e.signal, e.gave_up) for e in exits) == [(0, 0, 0, False), (1, 0, 0, False)]
    await run.agent.supervisor.reconcile()
    assert len(ready_files(tmp_path)) == 2  # neither was started again
    assert all(s.halted_generation == s.want.generation for s in run.agent.supervisor.slots)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("agent")]

    controller.job_state = pb.COMPLETED
    await asyncio.wait_for(run.task, 10)  # the agent ended on its own
    assert run.agent.job_completed.is_set() and not run.stop.is_set()


async def test_completed_stops_running_trainers_after_the_finish_grace_then_the_agent_exits(controller, start_agent,
                                                                                          tmp_path):
    """A trainer that does not exit on its own after COMPLETED is finishing (the heartbeats say
    so) until --finish-grace-s has passed; then it is stopped and the agent exits."""
    run = start_agent([controller.address], finish_grace_s=1.0)
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    controller.job_state = pb.COMPLETED
    await wait_for(lambda: controller.finishing.get("h1") == 1, 10, "a heartbeat saying one trainer finishes")
    assert alive(info["pid"])
    await asyncio.wait_for(run.task, 10)
    assert not alive(info["pid"])
    assert controller.exits == []  # a stop is no exit of the trainer's own


async def test_completed_with_idle_stops_trainers_and_starts_nothing(controller, start_agent, tmp_path):
    run = start_agent([controller.address], on_job_complete="idle", finish_grace_s=0.5)
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    controller.job_state = pb.COMPLETED
    await wait_for(lambda: not alive(info["pid"]), 10, "the trainer stopped")
    beats = controller.heartbeats["h1"]
    await wait_for(lambda: controller.heartbeats["h1"] >= beats + 3, 10, "heartbeats go on")
    controller.order("h1", "o1", pb.Order.RESTART, pb.Assignment(replica_id="r0"))
    a = await wait_for(lambda: controller.acks.get("o1"), 10, "ack of o1")
    assert not a.ok and "the job is COMPLETED: host h1 starts no trainers" in a.error
    controller.forget = 1  # registering again must not start trainers either
    await wait_for(lambda: len(controller.registrations) == 2, 10, "a second registration")
    await run.agent.supervisor.reconcile()
    assert len(ready_files(tmp_path)) == 1 and not run.task.done()
    assert all(s.handle is None for s in run.agent.supervisor.slots)


async def test_a_registration_answer_saying_completed_starts_nothing(controller, start_agent, tmp_path):
    controller.job_state = pb.COMPLETED
    run = start_agent([controller.address])
    await asyncio.wait_for(run.task, 10)
    assert ready_files(tmp_path) == [] and run.agent.job_completed.is_set()
