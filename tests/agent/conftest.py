"""Fixtures of the agent tests: an in-process fake controller and Agent tasks with real trainers."""

from __future__ import annotations

import asyncio

import pytest

from agent.runner import Agent
from agent.settings import AgentSettings
from tests.agent.fake_controller import FakeController
from tests.agent.helpers import trainer_command


@pytest.fixture
async def controller():
    fake = await FakeController().start()
    yield fake
    await fake.stop()


class Running:
    """An Agent task with its stop event; stopping waits for its trainers to stop."""

    def __init__(self, settings: AgentSettings) -> None:
        self.agent = Agent(settings)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.agent.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 15)


@pytest.fixture
async def start_agent(tmp_path):
    started: list[Running] = []

    def start(addresses, **kw) -> Running:
        base = dict(controller_addresses=tuple(addresses), host_id="h1",
                    command=trainer_command(tmp_path), replica_id="r0", ranks=(0,),
                    world_size=2, heartbeat_interval_s=0.1, stop_grace_s=2.0, finish_grace_s=2.0,
                    reconnect_base_s=0.05)
        base.update(kw)
        started.append(Running(AgentSettings(**base).validate()))
        return started[-1]

    yield start
    for running in started:
        if not running.task.done():
            await running.close()
