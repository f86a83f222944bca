"""The issue's stale-ASSIGN sequence over real gRPC: an in-process controller on a fake clock
and real agents (in-process, real trainer processes) behind partitions the test cuts and
heals. r2 moves h2 -> spare0 while spare0 is cut off, then spare0 -> h2; when spare0 comes
back it runs nothing (the old ASSIGN is never replayed), and the next swap onto it works."""

from __future__ import annotations

import asyncio

import pytest

from agent.runner import Agent
from agent.settings import AgentSettings
from controller.core.commands import Drain, Tick
from controller.core.model import HostState
from controller.service.server import ControllerServer
from controller.settings import ControllerSettings
from tests.agent.helpers import alive, ready_files, trainer_command, wait_for
from tests.agent.partition import Partition
from tests.controller.conftest import FakeClock

HB = 5.0


@pytest.fixture
async def controller():
    clock = FakeClock()
    server = ControllerServer(ControllerSettings(job_id="t", replicas=3, min_replicas=1, heartbeat_timeout_s=HB),
                              clock=clock)
    await server.start()
    await server.wait_leading(10)
    yield server, clock
    await server.stop()


@pytest.fixture
async def agents(controller, tmp_path):
    server, _ = controller
    started: list[tuple[Agent, asyncio.Event, asyncio.Task, Partition]] = []

    async def start(host_id: str, **kw) -> tuple[Agent, Partition]:
        link = await Partition(server.grpc_address).start()
        settings = AgentSettings(controller_addresses=(link.address,), host_id=host_id,
                                 command=trainer_command(tmp_path), heartbeat_interval_s=0.1,
                                 reconnect_base_s=0.05, reconnect_cap_s=0.2, rpc_timeout_s=2.0,
                                 stop_grace_s=2.0, **kw).validate()
        agent, stop = Agent(settings), asyncio.Event()
        started.append((agent, stop, asyncio.create_task(agent.run(stop)), link))
        await wait_for(lambda: host_id in server.order_streams, 10, f"{host_id}'s order stream")
        return agent, link

    yield start
    for agent, stop, task, link in started:
        link.heal()
        stop.set()
        await asyncio.wait_for(task, 15)
        await link.close()


def r2_trainers(tmp_path, host_id: str) -> list[dict]:
    return [t for t in ready_files(tmp_path, "r2") if t["env"]["FTHSDP_HOST_ID"] == host_id and alive(t["pid"])]


async def test_a_host_that_was_cut_off_never_runs_a_superseded_assign(controller, agents, tmp_path):
    server, clock = controller
    state = server.state
    h2, h2_link = await agents("h2", replica_id="r2", ranks=(0,), world_size=1)
    spare0, spare0_link = await agents("spare0", spare=True)
    await wait_for(lambda: r2_trainers(tmp_path, "h2"), 10, "r2's trainer on h2")

    async def advance(seconds: int, fresh: tuple[str, ...]) -> None:
        """Move the controller's clock 1 s at a time; hosts in `fresh` beat at every step."""
        for _ in range(seconds):
            clock.advance(1.0)
            await wait_for(lambda: all(state.hosts[h].last_seen == clock.now for h in fresh), 10,
                           f"heartbeats of {fresh}")
            await server.apply(Tick())  # what the ticker does, at once

    # h2 is cut off first, spare0 a little later: h2 is declared dead while spare0 still
    # counts as alive, so r2 moves to spare0, whose ASSIGN cannot reach it. A heartbeat h2 sent
    # just before its cut may still be handled after the clock's next step, so the steps count
    # from the last_seen the controller holds, not from the cut.
    h2_link.cut()
    await wait_for(lambda: "h2" not in server.order_streams, 10, "h2's stream to break")
    for _ in range(2 * int(HB)):
        if clock.now - state.hosts["h2"].last_seen >= HB - 1:
            break
        await advance(1, fresh=("spare0",))
    spare0_link.cut()
    await wait_for(lambda: "spare0" not in server.order_streams, 10, "spare0's stream to break")
    for _ in range(3):
        if state.hosts["h2"].state == HostState.DEAD:
            break
        await advance(1, fresh=())
    assert state.hosts["h2"].state == HostState.DEAD and state.hosts["spare0"].state != HostState.DEAD
    assert state.hosts["spare0"].assignment.replica_id == "r2"
    stale = server.pending_orders["spare0"]
    assert stale.kind == "ASSIGN"

    # h2 comes back: its work moved, so it joins the pool and stops its trainer.
    h2_link.heal()
    await wait_for(lambda: state.hosts["h2"].state == HostState.SPARE and h2.assignment is None, 10,
                   "h2 back in the pool")
    await wait_for(lambda: not r2_trainers(tmp_path, "h2"), 10, "h2's stale trainer stopped")
    # spare0 stays silent: declared dead, r2 moves back to h2, and spare0's ASSIGN is superseded.
    await advance(5, fresh=("h2",))
    assert state.hosts["spare0"].state == HostState.DEAD and state.hosts["h2"].assignment.replica_id == "r2"
    assert server.pending_orders["spare0"].kind == "STOP" and state.is_superseded(stale)
    await wait_for(lambda: r2_trainers(tmp_path, "h2"), 10, "r2's trainer on h2 again")

    # spare0 comes back: told it runs nothing; the old ASSIGN is not replayed.
    spare0_link.heal()
    await wait_for(lambda: state.hosts["spare0"].state == HostState.SPARE and "spare0" in server.order_streams,
                   10, "spare0 back in the pool")
    await wait_for(lambda: spare0.version == state.hosts["spare0"].assignment_version, 10, "spare0's CURRENT")
    assert spare0.assignment is None and not r2_trainers(tmp_path, "spare0")
    assert spare0.version > stale.version

    # The next swap onto spare0 is accepted (no "duplicate assignment").
    await server.apply(Drain("h2"))
    await wait_for(lambda: r2_trainers(tmp_path, "spare0"), 10, "r2 on spare0")
    await wait_for(lambda: not r2_trainers(tmp_path, "h2"), 10, "r2 stopped on h2")
    assert not [e for e in state.events if e.kind == "order_failed"], [e.message for e in state.events]
    assert spare0.assignment.replica_id == "r2" and h2.assignment is None
