"""A replica that spans two hosts, with a real controller and real agents (subprocesses on
loopback) running scripted trainers: the controller lays it out, every rank learns where the
replica meets, a dead rank restarts the whole replica, a cleanly stopped agent hands its work
to the spare and comes back at once, and a crashed agent's next process takes its host over.

Every wait is a condition with a generous bound; nothing asserts on wall-clock time."""

from __future__ import annotations

import os
import signal

import pytest

from tests.agent.cluster import Cluster
from tests.agent.helpers import alive, wait_for, wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 30
ADDRESS = {"a0": "127.0.0.2", "a1": "127.0.0.3", "sp": "127.0.0.4"}


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(tmp_path)
    await c.start_controller(1, 3, "--hosts-per-replica", "2", "--ranks-per-host", "1")
    yield c
    await c.close()


async def agent(c: Cluster, host: str, *flags: str, name: str = ""):
    return await c.start_agent(host, replica="", spare="--spare" in flags, extra=(
        "--advertise-address", ADDRESS[host], "--state-dir", str(c.root / f"state-{host}"),
        *[f for f in flags if f != "--spare"]), **({"name": name} if name else {}))


def running(c: Cluster, host: str) -> list[dict]:
    return [t for t in c.trainers("r0") if t["env"]["FTHSDP_HOST_ID"] == host and alive(t["pid"])]


async def fresh(c: Cluster, *old: dict) -> dict[str, dict]:
    """Each host's one live r0 trainer, once none of `old` is among them."""
    gone = {t["pid"] for t in old}

    def check():
        now = {h: running(c, h) for h in ("a0", "a1", "sp")}
        live = {h: ts[0] for h, ts in now.items() if len(ts) == 1 and ts[0]["pid"] not in gone}
        return len(live) == 2 and not any(alive(p) for p in gone) and live
    return await wait_for(check, BOUND_S, "the replica's two ranks restarted")


async def test_a_replica_on_two_hosts_restarts_as_a_unit_and_survives_its_agents(cluster):
    c = cluster
    a0, a1 = await agent(c, "a0"), await agent(c, "a1")
    await agent(c, "sp", "--spare")
    first = await fresh(c)
    assert set(first) == {"a0", "a1"}
    for host, t in first.items():
        env = t["env"]
        # The controller's layout: one rank per host, both ranks meet at a0's pod IP, not loopback.
        assert (env["FTHSDP_RANK"], env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (
            "0" if host == "a0" else "1", "0" if host == "a0" else "1", "2", "0")
        assert env["MASTER_ADDR"] == "127.0.0.2" and env["FTHSDP_COORDINATOR_ADDRESS"].startswith("127.0.0.2:")
    assert first["a0"]["env"]["MASTER_PORT"] == first["a1"]["env"]["MASTER_PORT"]
    assert (await c.host("sp"))["spare"]

    # Rank 1 dies: both hosts restart their ranks together (the survivor does not limp on).
    os.kill(first["a1"]["pid"], signal.SIGKILL)
    second = await fresh(c, *first.values())
    assert set(second) == {"a0", "a1"} and (await c.replica("r0"))["restarts"] == 1
    assert not (await c.host("a1"))["cordoned"]

    # a1's agent stops cleanly: it deregisters, the spare takes rank 1, a0 restarts with it.
    a1.proc.send_signal(signal.SIGTERM)
    assert await a1.proc.wait() == 0
    third = await fresh(c, *second.values())
    assert set(third) == {"a0", "sp"} and third["sp"]["env"]["MASTER_ADDR"] == "127.0.0.2"
    [left] = await c.events("host_left")
    assert "host a1 left: its agent stopped: the agent got SIGTERM" in left["message"]
    assert not (await c.host("a1"))["cordoned"]
    # ... and a1's next agent registers at once (no "already registered by a live agent").
    await agent(c, "a1", name="a1-again")
    assert (await c.host("a1"))["spare"]

    # a0's agent crashes; its next process presents the kept secret and takes a0 over at once.
    a0.proc.kill()
    await wait_for(lambda: not running(c, "a0"), BOUND_S, "a0's trainer died with its agent")
    await agent(c, "a0", name="a0-again")
    await wait_for_async(lambda: _taken_over(c), BOUND_S, "a0 taken over")
    fourth = await fresh(c, *third.values())
    assert set(fourth) == {"a0", "sp"}
    assert not await c.events("host_death") and (await c.get("/api/v1/job"))["swaps"] == 1


async def _taken_over(c: Cluster):
    return [e for e in await c.events("host") if "a0 taken over by a restarted agent" in e["message"]]

