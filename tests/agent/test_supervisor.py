"""The supervisor with real scripted trainer processes and real signals.

Restart-budget windows run on a fake clock (the supervisor takes `clock`); process events
are waited on with bounded condition waits.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace


from agent.policy import Placement, Role, Want
from agent.process import Launch, SubprocessHooks
from agent.settings import AgentSettings
from agent.supervisor import Supervisor, TrainerExit
from tests.agent.helpers import alive, ready_files, standby_files, trainer_command, wait_for, wait_for_async


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


R0 = Placement("r0", 0, 2, rendezvous="10.9.0.1:29500", coordinator="10.9.0.1:29501")
TRAIN = [Want(Role.TRAIN, 0, R0, version=7)]
BOTH = [Want(Role.TRAIN, 0, Placement("r0", r, 2, r, 2, "10.9.0.1:29500", "10.9.0.1:29501"), 7) for r in (0, 1)]


async def test_start_sets_environment_and_placeholders(tmp_path):
    async with Rig(tmp_path) as rig:
        rig.sup.set_wants(TRAIN)
        [info] = await rig.ready(1)
    env = info["env"]
    assert (env["FTHSDP_REPLICA_ID"], env["FTHSDP_RANK"], env["FTHSDP_WORLD_SIZE"]) == ("r0", "0", "2")
    assert (env["FTHSDP_HOST_ID"], env["FTHSDP_JOB_ID"], env["FTHSDP_CONTROLLER"]) == ("h1", "j1", "127.0.0.1:9")
    # torchrun's variables: a replica's ranks meet at its rank-0 host.
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "2", "0", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.9.0.1", "29500")
    assert env["FTHSDP_COORDINATOR_ADDRESS"] == "10.9.0.1:29501"
    assert "FTHSDP_STANDBY" not in env
    assert info["argv"][-2:] == ["r0", "0"]
    assert not alive(info["pid"])  # stopped on the way out


async def test_a_dead_trainer_is_reported_and_its_replica_halts_until_an_order(tmp_path):
    async with Rig(tmp_path, slots=2, ranks=(0, 1)) as rig:
        rig.sup.set_wants(BOTH)
        first = await rig.ready(2)
        victim, survivor = sorted(first, key=lambda t: t["env"]["FTHSDP_RANK"])
        assert survivor["env"]["LOCAL_RANK"] == "1"
        os.kill(victim["pid"], signal.SIGKILL)
        [e] = await wait_for(lambda: rig.exits, 10, "exit report")
        assert (e.replica_id, e.rank, e.signal, e.exit_code, e.version) == ("r0", 0, signal.SIGKILL, -1, 7)
        assert "trainer ready" in e.stderr_tail
        # Not restarted alone: the other rank of its replica is stopped too (and not reported).
        await wait_for(lambda: not alive(survivor["pid"]), 10, "the surviving rank stopped")
        await rig.sup.reconcile()
        assert len(ready_files(tmp_path)) == 2 and len(rig.exits) == 1
        assert all(slot.handle is None for slot in rig.sup.slots)

        rig.sup.bump()  # the controller's RESTART: both ranks start together
        await rig.ready(4, "the replica restarted")


async def test_a_newer_version_for_what_runs_is_taken_without_a_restart(tmp_path):
    async with Rig(tmp_path) as rig:
        rig.sup.set_wants(TRAIN)
        [info] = await rig.ready(1)
        rig.sup.set_wants([Want(Role.TRAIN, 0, R0, version=9)])
        await rig.sup.reconcile()
        assert alive(info["pid"]) and rig.sup.slots[0].proc.version == 9
        os.kill(info["pid"], signal.SIGKILL)
        [e] = await wait_for(lambda: rig.exits, 10, "exit report")
        assert e.version == 9


async def test_standby_restart_budget_on_a_fake_clock(tmp_path):
    """Budget 1 per 60 s for standbys: a second death inside the window halts the slot; a
    death 100 s after the last restart is restarted again."""
    async with Rig(tmp_path, spare=True, replica_id="", ranks=(), world_size=0, standby=True,
                   restart_budget=1, restart_window_s=60.0, command=trainer_command(tmp_path)) as rig:
        rig.sup.set_wants([Want(Role.STANDBY)])
        for n in (1, 2):
            [pid] = await wait_for(lambda: len(standby_files(tmp_path)) == n and
                                   [s["pid"] for s in standby_files(tmp_path) if alive(s["pid"])], 10, f"standby {n}")
            rig.clock.now_s += 100
            os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: len(standby_files(tmp_path)) == 3, 10, "restart after the window passed")
        [pid] = [s["pid"] for s in standby_files(tmp_path) if alive(s["pid"])]
        rig.clock.now_s += 10
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: not alive(pid), 10, "the third standby gone")

        async def given_up() -> bool:  # its exit is seen once the process watcher reports it
            await rig.sup.reconcile()
            return rig.sup.slots[0].handle is None

        await wait_for_async(given_up, 10, "the slot halted (budget spent)")
        assert len(standby_files(tmp_path)) == 3  # ...and not restarted
        assert rig.exits == []  # standbys have no replica to report to


async def test_exit_code_and_stderr_tail_are_reported(tmp_path):
    async with Rig(tmp_path, "--exit", "3") as rig:
        rig.sup.set_wants(TRAIN)
        [e] = await wait_for(lambda: rig.exits, 10, "exit report")
    assert (e.exit_code, e.signal) == (3, 0)
    assert e.stderr_tail.splitlines()[-2:] == ["trainer ready", "boom"]


async def test_finished_trainer_is_not_restarted(tmp_path):
    async with Rig(tmp_path, "--exit", "0") as rig:
        rig.sup.set_wants(TRAIN)
        [e] = await wait_for(lambda: rig.exits, 10, "exit report")
        await rig.sup.reconcile()
        assert e.exit_code == 0
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


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


async def test_a_stopped_trainer_acts_on_the_stop_at_once_not_after_the_grace(tmp_path):
    """A SIGSTOPped (hung) trainer dies of the SIGTERM, not of the SIGKILL after the grace:
    a SIGTERM alone would stay pending, and so would its peers that wait on its sockets."""
    hooks = SubprocessHooks(echo_stderr=False)
    handle = await hooks.start(Launch(list(trainer_command(tmp_path)), dict(os.environ), False, "h1 r0/1"))
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    os.kill(info["pid"], signal.SIGSTOP)
    await wait_for(lambda: _stopped(info["pid"]), 10, "the trainer to be stopped")
    status = await asyncio.wait_for(hooks.stop(handle, grace_s=60.0), 30.0)
    assert (status.exit_code, status.signal) == (None, signal.SIGTERM)


async def test_a_replicas_ranks_are_stopped_together_not_one_after_the_other(tmp_path):
    """Rank 0 ignores SIGTERM (it is stopped only after a minute's grace); rank 1 goes at once."""
    async with Rig(tmp_path, "--ignore-term-rank", "0", slots=2, ranks=(0, 1), stop_grace_s=60.0) as rig:
        rig.sup.set_wants(BOTH)
        ready = sorted(await rig.ready(2), key=lambda t: t["env"]["FTHSDP_RANK"])
        rig.sup.set_wants([])
        stopping = asyncio.create_task(rig.sup.reconcile())
        await wait_for(lambda: not alive(ready[1]["pid"]), 20, "rank 1 stopped while rank 0 is in its grace")
        assert alive(ready[0]["pid"]) and not stopping.done()
        os.kill(ready[0]["pid"], signal.SIGKILL)  # end its grace (we started it)
        await asyncio.wait_for(stopping, 20)
        assert all(slot.handle is None for slot in rig.sup.slots) and rig.exits == []


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
        r2 = Placement("r2", 1, 2, 0, 1, "10.9.0.2:29500", "10.9.0.2:29501")
        rig.sup.set_wants([Want(Role.TRAIN, 0, r2)])
        await rig.sup.reconcile()
        [info] = await rig.ready(1)
        assert info["warm"] and info["pid"] in {s["pid"] for s in standbys}
        assert (info["env"]["FTHSDP_REPLICA_ID"], info["env"]["FTHSDP_RANK"]) == ("r2", "1")
        assert "FTHSDP_STANDBY" not in info["env"]
        other = ({s["pid"] for s in standbys} - {info["pid"]}).pop()
        await wait_for(lambda: not alive(other), 5, "the unused standby to stop")
        # A warm trainer sees exactly what a cold one of the same placement sees.
        rig.sup.set_wants([Want(Role.IDLE)])
        await rig.sup.reconcile()
        rig.sup.settings = replace(rig.sup.settings, standby=False)
        rig.sup.set_wants([Want(Role.TRAIN, 0, r2)])
        await rig.sup.reconcile()
        cold = [t for t in await rig.ready(2) if not t["warm"]][0]
        assert cold["env"] == info["env"]


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
