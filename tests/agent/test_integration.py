"""A real controller and real agents (subprocesses on loopback) with scripted trainers that
join quorums: trainer death, agent death, no spare, restart budget, refusals, drain.

Every wait is a condition with a generous bound; nothing asserts on wall-clock time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest

from tests.agent.cluster import CLI, Cluster
from tests.agent.helpers import alive, trainer_command, wait_for, wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 30


@pytest.fixture
async def cluster(tmp_path, request):
    """A controller (restart budget 0 unless the test passes another) and nothing else yet."""
    c = Cluster(tmp_path)
    await c.start_controller(restart_budget=getattr(request, "param", 0))
    yield c
    await c.close()


async def active_hosts(c: Cluster, **kw) -> None:
    for i, replica in enumerate(("r0", "r1", "r2"), start=1):
        await c.start_agent(f"h{i}", replica=replica, labels=f"zone={'aba'[i - 1]}", **kw)
    await wait_for(lambda: len(c.trainers()) == 3, BOUND_S, "three trainers ready")


async def healthy(c: Cluster, *replicas: str, beyond_step: int = 0):
    async def check():
        views = [await c.replica(r) for r in replicas]
        return all(v and v["state"] == "HEALTHY" and v["committed_step"] > beyond_step
                   for v in views) and views
    return await wait_for_async(check, BOUND_S, f"replicas {replicas} healthy past step "
                                                f"{beyond_step}")


async def test_trainer_death_gives_up_and_the_warm_spare_rebuilds_the_replica(cluster):
    c = cluster
    await active_hosts(c)
    await c.start_agent("h4", spare=True, standby=True, labels="zone=b")
    await wait_for(lambda: list(c.ready_dir.glob("standby-*.json")), BOUND_S, "standby up")
    await healthy(c, "r0", "r1", "r2")
    [victim] = c.trainers("r0")

    os.kill(victim["pid"], signal.SIGKILL)
    # Reported at once (not by heartbeat); the controller's restart budget is 0: h1 is replaced.
    exits = await wait_for_async(lambda: c.events("cordon"), BOUND_S, "h1 cordoned")
    assert "restart budget exhausted" in exits[0]["message"] and exits[0]["subject"] == "h1"
    assert "signal 9" in exits[0]["message"]
    assert not await c.events("host_death")
    rebuilt = await wait_for(lambda: [t for t in c.trainers("r0") if t["pid"] != victim["pid"]],
                             BOUND_S, "r0 rebuilt on the spare")
    env = rebuilt[0]["env"]
    assert (env["FTHSDP_HOST_ID"], env["FTHSDP_REPLICA_ID"], env["FTHSDP_RANK"]) == ("h4", "r0",
                                                                                  "0")
    assert rebuilt[0]["warm"]  # the pre-started standby took it
    h1, h4 = await c.host("h1"), await c.host("h4")
    assert h1["cordoned"] and h1["assignment"] is None
    assert h4["assignment"]["replica_id"] == "r0" and not h4["spare"]
    job = await c.get("/api/v1/job")
    assert job["swaps"] == 1 and job["spares_free"] == 0
    await healthy(c, "r0", "r1", "r2", beyond_step=(await c.replica("r0"))["committed_step"])


async def test_agent_death_swaps_after_heartbeat_timeout_and_repair_returns_it(cluster):
    c = cluster
    await active_hosts(c)
    await c.start_agent("h4", spare=True, labels="zone=b")  # cold spare, other zone
    await c.start_agent("h5", spare=True, labels="zone=a")  # cold spare, h1's zone
    [victim] = c.trainers("r0")
    agent = next(p for p in c.procs if p.name == "h1")

    agent.proc.kill()
    await wait_for(lambda: not alive(victim["pid"]), BOUND_S, "h1's trainer to die with it")
    deaths = await wait_for_async(lambda: c.events("host_death"), BOUND_S, "h1 declared dead")
    assert "silent" in deaths[0]["message"]
    rebuilt = await wait_for(lambda: [t for t in c.trainers("r0") if t["pid"] != victim["pid"]],
                             BOUND_S, "r0 rebuilt")
    assert rebuilt[0]["env"]["FTHSDP_HOST_ID"] == "h5"  # same zone as h1
    assert not rebuilt[0]["warm"]
    await healthy(c, "r0")

    # The repaired host registers again: it joins the pool as a spare, uncordoned.
    await c.start_agent("h1", replica="r0", labels="zone=a")
    h1 = await c.host("h1")
    assert h1["spare"] and not h1["cordoned"] and h1["assignment"] is None
    assert (await c.get("/api/v1/job"))["spares_free"] == 2


@pytest.mark.parametrize("cluster", [1], indirect=True)  # a restart budget of 1
async def test_budget_exhausted_cordons_and_without_spares_the_job_continues(cluster):
    c = cluster
    await active_hosts(c)
    await healthy(c, "r0", "r1", "r2")
    [first] = c.trainers("r2")
    os.kill(first["pid"], signal.SIGKILL)
    second = await wait_for(lambda: [t for t in c.trainers("r2") if t["pid"] != first["pid"]],
                            BOUND_S, "r2 restarted")
    assert second[0]["env"]["FTHSDP_HOST_ID"] == "h3"
    assert not (await c.host("h3"))["cordoned"]  # one replica restart is within the budget
    assert (await c.replica("r2"))["restarts"] == 1
    [restart] = await c.events("replica_restart")
    assert "trainer rank 0 on host h3 died (signal 9)" in restart["message"]

    os.kill(second[0]["pid"], signal.SIGKILL)
    h3 = await wait_for_async(lambda: _cordoned(c, "h3"), BOUND_S, "h3 cordoned")
    assert h3["cordon_reason"].startswith("restart budget exhausted")
    no_spare = await wait_for_async(lambda: c.events("no_spare"), BOUND_S, "no-spare event")
    assert "stays out" in no_spare[0]["message"]
    # r2 stays out; r0 and r1 keep committing steps.
    step = (await c.replica("r0"))["committed_step"]
    await healthy(c, "r0", "r1", beyond_step=step + 3)
    assert (await c.replica("r2"))["state"] == "DEAD"
    assert (await c.host("h3"))["assignment"]["replica_id"] == "r2"
    assert len(c.trainers("r2")) == 2 and not alive(second[0]["pid"])


async def _cordoned(c: Cluster, host_id: str):
    h = await c.host(host_id)
    return h if h["cordoned"] else None


async def test_refusals_and_drain(cluster):
    c = cluster
    await active_hosts(c)
    await c.start_agent("h4", spare=True)

    # A second agent for a live host waits (it never takes h1 from its live agent); a second
    # host for a held rank is refused.
    dup = await c.start_agent("h1", replica="r0", wait=False)
    await wait_for(lambda: "held by a live agent" in dup.log(), BOUND_S, "the second h1 agent told to wait")
    assert dup.proc.returncode is None and (await c.host("h1"))["incarnation"] != ""
    [h1_trainer] = c.trainers("r0")
    dup.proc.send_signal(signal.SIGTERM)
    assert await dup.proc.wait() == 0
    assert (await c.host("h1"))["state"] == "ACTIVE" and alive(h1_trainer["pid"])  # it deregistered nothing
    other = await c.start_agent("h9", replica="r1", wait=False)
    assert await other.proc.wait() == 3
    assert "duplicate assignment" in other.log()

    # Drain needs the admin token; with it, h2's work moves to the spare and h2 stops.
    assert (await c.post("/api/v1/hosts/h2/drain")).status_code == 401
    assert (await c.post("/api/v1/hosts/h2/drain", "wrong")).status_code == 403
    response = await c.post("/api/v1/hosts/h2/drain", "s3cret")
    assert response.status_code == 200, response.text
    [old] = [t for t in c.trainers("r1") if t["env"]["FTHSDP_HOST_ID"] == "h2"]
    await wait_for(lambda: not alive(old["pid"]), BOUND_S, "h2's trainer stopped")
    await wait_for(lambda: [t for t in c.trainers("r1") if t["env"]["FTHSDP_HOST_ID"] == "h4"],
                   BOUND_S, "r1 on h4")
    h2 = await c.host("h2")
    assert h2["cordoned"] and h2["cordon_reason"] == "drained by an operator"
    assert not await c.events("order_failed")


async def test_a_frozen_agent_that_comes_back_stops_its_stale_trainer(cluster):
    """SIGSTOP an agent past the heartbeat timeout: its work moves to the spare. On SIGCONT it
    learns it was declared dead, registers as a new agent, is told it is a spare, and stops
    the trainer it still ran, so no rank runs twice."""
    c = cluster
    await active_hosts(c)
    await c.start_agent("h4", spare=True)
    [stale] = c.trainers("r1")
    agent = next(p for p in c.procs if p.name == "h2")
    agent.proc.send_signal(signal.SIGSTOP)
    try:
        await wait_for_async(lambda: c.events("host_death"), BOUND_S, "h2 declared dead")
        await wait_for(lambda: [t for t in c.trainers("r1") if t["pid"] != stale["pid"]],
                       BOUND_S, "r1 rebuilt on h4")
        assert alive(stale["pid"])  # the frozen agent could not stop it
    finally:
        agent.proc.send_signal(signal.SIGCONT)
    await wait_for(lambda: not alive(stale["pid"]), BOUND_S, "the stale trainer stopped")

    async def back_in_the_pool():
        h2 = await c.host("h2")
        return h2["spare"] and h2["assignment"] is None and h2["state"] != "DEAD"
    await wait_for_async(back_in_the_pool, BOUND_S, "h2 back in the spare pool")
    assert len([t for t in c.trainers("r1") if alive(t["pid"])]) == 1  # r1 runs once, on h4


async def test_replicas_that_finish_complete_the_job_and_their_agents_exit_0(tmp_path):
    """r0 finishes first: its trainer's exit 0 is a normal end (no death, no restart) while the
    job runs on; once r1 finished too, the COMPLETED job ends every agent with exit status 0."""
    c = Cluster(tmp_path)
    try:
        await c.start_controller(replicas=2)
        agents = [await c.start_agent(f"h{i}", replica=f"r{i}",
                                      command=trainer_command(c.ready_dir, "--join", "--finish-after", str(3 + 4 * i)))
                  for i in range(2)]
        for agent in agents:
            assert await asyncio.wait_for(agent.proc.wait(), BOUND_S) == 0, agent.log()
            assert "the job is COMPLETED" in agent.log()
        job = await c.get("/api/v1/job")
        assert (job["job_state"], job["replicas_finished"], job["deaths"]) == ("COMPLETED", 2, {})
        for rid in ("r0", "r1"):
            assert (await c.replica(rid))["state"] == "FINISHED"
            [trainer] = c.trainers(rid)  # started once, never again
            assert not alive(trainer["pid"])
        kinds = [(e["kind"], e["subject"]) for e in await c.events()]
        assert kinds.index(("finished", "r0")) < kinds.index(("job", "job"))  # r0 ended while the job ran
        assert not [k for k in kinds if k[0] == "death"]
        out = subprocess.run([*CLI, "status", "--url", c.http], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "COMPLETED" in out.stdout and "2 finished" in out.stdout, out.stderr
    finally:
        await c.close()
