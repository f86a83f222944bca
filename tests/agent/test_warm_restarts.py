"""Warm restarts with real processes: an agent with --warm-restarts keeps a pre-started reserve
standby next to each trainer; when a trainer is SIGKILLed and the controller restarts the
replica, the reserves (started before the kill) take the ranks and the replica trains on.

A real controller and agent (subprocesses on loopback), scripted trainers that join quorums;
every wait is a condition with a bound, nothing asserts on wall-clock time."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agent.policy import Placement, Role, Want
from agent.process import SubprocessHooks
from agent.settings import AgentSettings
from agent.supervisor import Supervisor, TrainerExit
from tests.agent.cluster import Cluster
from tests.agent.helpers import alive, ready_files, standby_files, trainer_command, wait_for, wait_for_async

BOUND_S = 30


@pytest.mark.slow
async def test_a_killed_trainer_is_replaced_by_the_reserve_started_before_the_kill(tmp_path):
    c = Cluster(tmp_path)
    try:
        await c.start_controller(1, 2)  # one replica; a trainer death restarts it in place
        agent = await c.start_agent("h1", replica="r0", ranks="0,1", world_size=2, extra=("--warm-restarts", "--reserve-delay-s", "0"))
        await wait_for(lambda: len(c.trainers()) == 2, BOUND_S, "both ranks of r0 started")
        # Cold starts: no reserve existed yet. Then one reserve per slot, next to its trainer.
        assert not any(t["warm"] for t in c.trainers())
        reserves = await wait_for(lambda: len(standby_files(c.ready_dir)) == 2 and standby_files(c.ready_dir),
                                  BOUND_S, "a reserve standby next to each trainer")
        reserve_pids = {r["pid"] for r in reserves}
        assert all(alive(pid) for pid in reserve_pids)
        step = (await wait_for_async(_committed(c, 0), BOUND_S, "r0 trains"))
        [victim] = c.trainers("r0", "0")
        others = {t["pid"] for t in c.trainers()}

        os.kill(victim["pid"], signal.SIGKILL)
        new = await wait_for(lambda: len(c.trainers()) == 4 and [t for t in c.trainers() if t["pid"] not in others],
                             BOUND_S, "r0's ranks replaced")
        # The replacements are the reserves, pre-started before the kill, handed the same ranks.
        assert {t["pid"] for t in new} == reserve_pids
        assert all(t["warm"] for t in new)
        assert sorted(t["env"]["FTHSDP_RANK"] for t in new) == ["0", "1"]
        assert {t["env"]["FTHSDP_REPLICA_ID"] for t in new} == {"r0"}
        assert "FTHSDP_STANDBY" not in new[0]["env"]
        # The old trainers are gone: the killed one, and its replica-mate stopped for the restart.
        assert not any(alive(pid) for pid in others)
        # Training goes on, and new reserves stand by for the next failure.
        await wait_for_async(_committed(c, step), BOUND_S, f"r0 commits past step {step} again")
        fresh = await wait_for(lambda: [r for r in standby_files(c.ready_dir) if r["pid"] not in reserve_pids
                                        and alive(r["pid"])], BOUND_S, "new reserves")
        assert len(fresh) <= 2
        assert "reserve standby takes replica r0 rank 0" in agent.log()
    finally:
        await c.close()


def _committed(c: Cluster, beyond: int):
    async def check():
        r0 = await c.replica("r0")
        return r0 and r0["state"] == "HEALTHY" and r0["committed_step"] > beyond and r0["committed_step"]
    return check


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


R0 = Placement("r0", 0, 2, rendezvous="10.9.0.1:29500", coordinator="10.9.0.1:29501")


async def test_a_dead_reserve_is_restarted_and_an_idle_slot_stops_it(tmp_path):
    """Supervisor and real processes: the reserve has exactly a standby's environment; one
    that dies is restarted within the budget (then restarts are cold); IDLE stops it. The fake
    clock moves the reserve delay and the budget window."""
    exits: list[TrainerExit] = []
    clock = Clock()
    settings = AgentSettings(controller_addresses=("127.0.0.1:9",), host_id="h1", job_id="j1",
                             command=trainer_command(tmp_path), replica_id="r0", ranks=(0,), world_size=2,
                             stop_grace_s=2.0, warm_restarts=True, reserve_delay_s=5.0,
                             restart_budget=1).validate()
    sup = Supervisor(settings, SubprocessHooks(on_exit=lambda: sup.wake.set(), echo_stderr=False), exits.append,
                     clock, dict(os.environ))
    stop = asyncio.Event()
    task = asyncio.create_task(sup.run(stop))
    try:
        sup.set_wants([Want(Role.TRAIN, 0, R0, version=7)])
        [trainer] = await wait_for(lambda: ready_files(tmp_path), 10, "the trainer")
        await sup.reconcile()
        assert sup.slots[0].reserve is None  # not before reserve_delay_s (fake clock)
        clock.now_s += 5.0
        sup.wake.set()
        [first] = await wait_for(lambda: standby_files(tmp_path), 10, "a reserve")
        assert sup.slots[0].reserve.pid == first["pid"] != trainer["pid"]
        env = _environ(first["pid"])  # a standby's, as a spare's standby gets it: no assignment yet
        assert (env["FTHSDP_STANDBY"], env["FTHSDP_HOST_ID"], env["FTHSDP_JOB_ID"]) == ("1", "h1", "j1")
        assert not {"FTHSDP_REPLICA_ID", "FTHSDP_RANK", "RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)

        os.kill(first["pid"], signal.SIGKILL)  # within the budget (1): restarted
        [second] = await wait_for(lambda: [r for r in standby_files(tmp_path) if r["pid"] != first["pid"]], 10,
                                  "the reserve restarted")
        assert sup.slots[0].reserve_restart_times_s == [1005.0]
        os.kill(second["pid"], signal.SIGKILL)  # budget spent: no reserve until the window frees one
        await wait_for(lambda: not alive(second["pid"]) and sup.slots[0].reserve is None, 10, "given up")
        await sup.reconcile()
        assert sup.slots[0].reserve is None and len(standby_files(tmp_path)) == 2
        clock.now_s += settings.restart_window_s + 1
        sup.wake.set()
        [third] = await wait_for(lambda: [r for r in standby_files(tmp_path)
                                          if r["pid"] not in (first["pid"], second["pid"])], 10, "a reserve again")
        assert alive(trainer["pid"]) and exits == []  # the trainer never noticed

        sup.set_wants([])  # the slot goes idle (as when the job completes): trainer and reserve stop
        await sup.reconcile()
        assert not alive(third["pid"]) and not alive(trainer["pid"])
        assert sup.slots[0].reserve is None
    finally:
        stop.set()
        sup.wake.set()
        await task
        await sup.shutdown()
