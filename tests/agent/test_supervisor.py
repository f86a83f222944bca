"""The supervisor with real scripted trainer processes and real signals.

Restart-budget windows run on a fake clock (the supervisor takes `clock`); process events
are waited on with bounded condition waits.
"""

from __future__ import annotations

import asyncio
import os
import signal


from agent.policy import Role, Want
from agent.process import SubprocessHooks
from agent.settings import AgentSettings
from agent.supervisor import Supervisor, TrainerExit
from tests.agent.helpers import alive, ready_files, standby_files, trainer_command, wait_for


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class Rig:
    """A supervisor with real processes, run in the background; exits are collected."""

    def __init__(self, tmp_path, *flags, **kw) -> None:
        self.dir = tmp_path
        self.exits: list[TrainerExit] = []
        self.clock = Clock()
        base = dict(controller_addresses=("127.0.0.1:9",), host_id="h1", job_id="j1",
                    command=trainer_command(tmp_path, *flags) + ("{replica_id}", "{rank}"),
                    replica_id="r0", ranks=(0,), world_size=2, stop_grace_s=2.0)
        base.update(kw)
        self.settings = AgentSettings(**base).validate()
        hooks = SubprocessHooks(on_exit=lambda: self.sup.wake.set(), echo_stderr=False)
        self.sup = Supervisor(self.settings, hooks, self.exits.append, self.clock,
                              dict(os.environ))
        self.stop = asyncio.Event()

    async def __aenter__(self) -> "Rig":
        self.task = asyncio.create_task(self.sup.run(self.stop))
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        self.sup.wake.set()
        await self.task
        await self.sup.shutdown()

    async def ready(self, n: int, what: str = "trainer ready") -> list[dict]:
        return (await wait_for(lambda: len(ready_files(self.dir)) >= n and ready_files(self.dir),
                               10, f"{n} ready files ({what})"))


TRAIN = [Want(Role.TRAIN, 0, "r0", 0, 2)]


async def test_start_sets_environment_and_placeholders(tmp_path):
    async with Rig(tmp_path) as rig:
        rig.sup.set_wants(TRAIN)
        [info] = await rig.ready(1)
    assert info["env"]["FTHSDP_REPLICA_ID"] == "r0"
    assert info["env"]["FTHSDP_RANK"] == "0"
    assert info["env"]["FTHSDP_WORLD_SIZE"] == "2"
    assert info["env"]["FTHSDP_HOST_ID"] == "h1"
    assert info["env"]["FTHSDP_JOB_ID"] == "j1"
    assert info["env"]["FTHSDP_CONTROLLER"] == "127.0.0.1:9"
    assert "FTHSDP_STANDBY" not in info["env"]
    assert info["argv"][-2:] == ["r0", "0"]
    assert not alive(info["pid"])  # stopped on the way out


async def test_killed_trainer_is_reported_and_restarted_then_given_up(tmp_path):
    async with Rig(tmp_path, restart_budget=1, restart_window_s=60.0) as rig:
        rig.sup.set_wants(TRAIN)
        [first] = await rig.ready(1)
        os.kill(first["pid"], signal.SIGKILL)
        second = (await rig.ready(2, "restart"))[-1]
        assert second["pid"] != first["pid"]
        assert rig.exits[0].signal == signal.SIGKILL and rig.exits[0].exit_code == -1
        assert not rig.exits[0].gave_up and "trainer ready" in rig.exits[0].stderr_tail

        rig.clock.now_s += 10  # still inside the window: the budget of 1 is spent
        os.kill(second["pid"], signal.SIGKILL)
        await wait_for(lambda: len(rig.exits) == 2, 10, "second exit report")
        assert rig.exits[1].gave_up and (rig.exits[1].replica_id, rig.exits[1].rank) == ("r0", 0)
        await rig.sup.reconcile()
        assert len(ready_files(tmp_path)) == 2 and rig.sup.slots[0].handle is None

        rig.sup.resume()  # an order (e.g. START) clears the halt
        await rig.ready(3, "start after resume")


async def test_budget_window_on_a_fake_clock(tmp_path):
    """Budget 1 per 60 s: a kill 100 s after the last restart is restarted again."""
    async with Rig(tmp_path, restart_budget=1, restart_window_s=60.0) as rig:
        rig.sup.set_wants(TRAIN)
        for n in (1, 2):
            pid = (await rig.ready(n))[-1]["pid"]
            rig.clock.now_s += 100
            os.kill(pid, signal.SIGKILL)
        await rig.ready(3, "restart after the window passed")
        assert [e.gave_up for e in rig.exits] == [False, False]


async def test_exit_code_and_stderr_tail_are_reported(tmp_path):
    async with Rig(tmp_path, "--exit", "3", restart_budget=0) as rig:
        rig.sup.set_wants(TRAIN)
        [e] = await wait_for(lambda: rig.exits, 10, "exit report")
    assert (e.exit_code, e.signal, e.gave_up) == (3, 0, True)
    assert e.stderr_tail.splitlines()[-2:] == ["trainer ready", "boom"]


async def test_finished_trainer_is_not_restarted(tmp_path):
    async with Rig(tmp_path, "--exit", "0") as rig:
        rig.sup.set_wants(TRAIN)
        [e] = await wait_for(lambda: rig.exits, 10, "exit report")
        await rig.sup.reconcile()
        assert (e.exit_code, e.gave_up) == (0, False)
        assert len(ready_files(tmp_path)) == 1 and rig.sup.slots[0].handle is None


async def test_stop_escalates_to_sigkill_and_reaches_the_process_group(tmp_path):
    async with Rig(tmp_path, "--ignore-term", "--child", stop_grace_s=0.3) as rig:
        rig.sup.set_wants(TRAIN)
        [info] = await rig.ready(1)
        assert alive(info["child_pid"])
        rig.sup.set_wants([])
        await rig.sup.reconcile()
        assert rig.exits == []  # a stop we asked for is not an exit to report
        await wait_for(lambda: not alive(info["pid"]) and not alive(info["child_pid"]), 5,
                       "trainer and its child to be gone")


async def test_restart_order_replaces_the_process(tmp_path):
    async with Rig(tmp_path) as rig:
        rig.sup.set_wants(TRAIN)
        [first] = await rig.ready(1)
        rig.sup.bump()
        assert await rig.sup.reconcile() == []
        [_, second] = await rig.ready(2)
        assert second["pid"] != first["pid"] and not alive(first["pid"])


async def test_standby_is_handed_the_assignment(tmp_path):
    async with Rig(tmp_path, spare=True, replica_id="", ranks=(), world_size=0, standby=True,
                   slots=2, command=trainer_command(tmp_path)) as rig:
        rig.sup.set_wants([Want(Role.STANDBY)] * 2)
        standbys = await wait_for(lambda: len(standby_files(tmp_path)) == 2 and
                                  standby_files(tmp_path), 10, "two standbys")
        rig.sup.set_wants([Want(Role.TRAIN, 0, "r2", 1, 2)])
        await rig.sup.reconcile()
        [info] = await rig.ready(1)
        assert info["warm"] and info["pid"] in {s["pid"] for s in standbys}
        assert (info["env"]["FTHSDP_REPLICA_ID"], info["env"]["FTHSDP_RANK"]) == ("r2", "1")
        assert "FTHSDP_STANDBY" not in info["env"]
        other = ({s["pid"] for s in standbys} - {info["pid"]}).pop()
        await wait_for(lambda: not alive(other), 5, "the unused standby to stop")


async def test_a_command_that_cannot_start_is_an_error_not_a_loop(tmp_path):
    async with Rig(tmp_path, command=("/nonexistent/trainer",)) as rig:
        rig.sup.set_wants(TRAIN)
        errors = await rig.sup.reconcile()
        assert "cannot start '/nonexistent/trainer'" in errors[0]
        assert await rig.sup.reconcile() == []  # halted until an order resumes it


async def test_children_of_a_dead_trainer_are_cleaned_up(tmp_path):
    async with Rig(tmp_path, "--child", restart_budget=0) as rig:
        rig.sup.set_wants(TRAIN)
        [info] = await rig.ready(1)
        os.kill(info["pid"], signal.SIGKILL)
        await wait_for(lambda: rig.exits, 10, "exit report")
        await wait_for(lambda: not alive(info["child_pid"]), 5, "the orphaned child to go")
