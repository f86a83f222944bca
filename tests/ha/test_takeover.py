"""A takeover does no damage of its own: two controller processes on a real etcd, real agent
processes with fake trainers that lead their replicas, the demo's 3 s heartbeat timeout.
SIGKILL the leader: nobody is declared dead, nothing is swapped, no trainer restarts. And a
spare that took a dead host's replica keeps it through the takeover: it registers again with
the standby carrying the assignment the store gave it, and is taken as what the store says it
is (not refused for its --spare flag)."""

import asyncio
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.settings import ControllerSettings
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos.dial import LEADER_METADATA_KEY
from tests.agent.cluster import Cluster
from tests.agent.helpers import alive
from tests.etcd_server import EtcdServer
from tests.waiting import wait_for_async, wait_for_blocking

from .cluster import ControllerProcess

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
HB = 3.0  # the demo's heartbeat timeout
GRACE = ControllerSettings(heartbeat_timeout_s=HB).takeover_grace_s
REPLICAS = ("r0", "r1", "r2")
DAMAGE = ("death", "host_death", "swap", "order_failed", "cordon", "no_spare")


@pytest.fixture
async def ha(tmp_path):
    etcd = EtcdServer.start_new()
    controllers = [ControllerProcess(etcd.endpoint, name=n, heartbeat_timeout_s=HB).start() for n in "ab"]
    agents = Cluster(tmp_path, heartbeat_timeout_s=HB)
    agents.grpc = ",".join(c.grpc for c in controllers)  # every agent and trainer knows both
    yield controllers, agents
    await agents.close()
    for c in controllers:
        c.stop()
    etcd.close()


async def committed(c: Cluster) -> dict[str, int]:
    return {r["replica_id"]: r["committed_step"] for r in await c.get("/api/v1/replicas")}


async def no_damage(c: Cluster, since: float = 0.0) -> None:
    """No death, swap, cordon... since `since` (the controller's clock: events' `at`)."""
    bad = [e for e in await c.events() if e["kind"] in DAMAGE and e["at"] >= since]
    # on failure, also the tail of each agent's log (its trainers' lines, their heartbeat failovers)
    assert not bad, (bad, {p.name: p.log()[-1500:] for p in c.procs})


async def health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    return reply.status


async def test_sigkill_of_the_leader_declares_nobody_dead_and_swaps_nothing(ha):
    controllers, c = ha
    await wait_for_blocking(lambda: any(x.leads() for x in controllers), 20, "a leader")
    leader, standby = sorted(controllers, key=lambda x: not x.leads())
    c.http = leader.http
    for i, rid in enumerate(REPLICAS, start=1):
        await c.start_agent(f"h{i}", replica=rid)
    await c.start_agent("spare0", spare=True)

    async def trained_past(steps=None):
        done = await committed(c)
        return all(done.get(r, -1) > (steps or {}).get(r, 2) for r in REPLICAS) and done
    await wait_for_async(trained_past, 60, "every replica training", every_s=0.2)

    # The standby is NOT_SERVING and names the leader when it refuses.
    assert await health(standby.grpc) == health_pb2.HealthCheckResponse.NOT_SERVING
    async with grpc.aio.insecure_channel(standby.grpc) as channel:
        stub = pbg.ControllerStub(channel)

        async def named():
            reply = await stub.Heartbeat(iter([pb.HeartbeatRequest(host_ids=["h1"])])).read()
            return reply.not_leader and reply.leader_address == leader.grpc
        await wait_for_async(named, 10, "the standby to name the leader")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h9", incarnation="x"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(err.value.trailing_metadata())[LEADER_METADATA_KEY] == leader.grpc

    pids = {rid: [t["pid"] for t in c.trainers(rid)] for rid in REPLICAS}
    before = await committed(c)
    # What the takeover must not add to. The fake trainers beat only by joining, so on a loaded
    # machine one that waits in the first round for replicas still starting can be dropped
    # before this point (CI once saw r0 "dropped from the round: no heartbeat for 3.0s" there).
    job_before, killed_at = await c.get("/api/v1/job"), time.time()
    leader.signal(signal.SIGKILL)
    await wait_for_blocking(standby.leads, 30, "the standby to take over")
    c.http = standby.http
    assert await health(standby.grpc) == health_pb2.HealthCheckResponse.SERVING
    [grace] = await c.events("grace")
    # Past the point where silence would count (the grace, then the heartbeat timeout),
    # with every replica still training: a client that never reconnected would be dead by now.
    danger_over_at = grace["at"] + GRACE + HB + 1.0

    async def safely_past():
        await no_damage(c, killed_at)
        return time.time() > danger_over_at and await trained_past({r: s + 2 for r, s in before.items()})
    await wait_for_async(safely_past, GRACE + HB + 40, "training past the takeover's danger window", every_s=0.3)

    await no_damage(c, killed_at)
    job = await c.get("/api/v1/job")
    assert job["swaps"] <= job_before["swaps"] and job["replicas_healthy"] == 3  # swap events: no_damage
    assert all(n <= job_before["deaths"].get(r, 0) for r, n in job["deaths"].items()), (job_before, job)
    hosts = {h["host_id"]: h for h in await c.get("/api/v1/hosts")}
    assert {h: x["state"] for h, x in hosts.items()} == {"h1": "ACTIVE", "h2": "ACTIVE", "h3": "ACTIVE",
                                                          "spare0": "SPARE"}
    assert all(x["seconds_since_seen"] < HB for x in hosts.values())  # they did reconnect
    for rid in REPLICAS:  # no trainer was stopped or restarted
        assert [t["pid"] for t in c.trainers(rid)] == pids[rid] and alive(pids[rid][0])
    assert not await asyncio.to_thread(leader.leads)


async def test_a_spare_holding_a_swapped_replica_keeps_it_through_a_failover(ha):
    controllers, c = ha
    await wait_for_blocking(lambda: any(x.leads() for x in controllers), 20, "a leader")
    leader, standby = sorted(controllers, key=lambda x: not x.leads())
    c.http = leader.http
    victim = None
    for i, rid in enumerate(REPLICAS, start=1):
        p = await c.start_agent(f"h{i}", replica=rid)
        victim = victim or p
    spare = await c.start_agent("spare0", spare=True)

    async def trained_past(steps=None):
        done = await committed(c)
        return all(done.get(r, -1) > (steps or {}).get(r, 2) for r in REPLICAS) and done
    await wait_for_async(trained_past, 60, "every replica training", every_s=0.2)

    victim.proc.send_signal(signal.SIGKILL)  # host h1: its agent, and its trainer with it

    async def swapped():
        host = await c.host("spare0")
        return host["state"] == "ACTIVE" and host["assignment"] and host["assignment"]["replica_id"] == "r0"
    await wait_for_async(swapped, 40, "r0 moved onto spare0", every_s=0.2)
    swapped_at = await committed(c)
    await wait_for_async(lambda: trained_past({"r0": swapped_at["r0"] + 2}), 60, "r0 training on spare0",
                         every_s=0.2)
    on_spare = [t["pid"] for t in c.trainers("r0") if alive(t["pid"])]
    assert len(on_spare) == 1, c.trainers("r0")
    before = await committed(c)
    deaths_before = len(await c.events("host_death"))

    leader.signal(signal.SIGKILL)
    await wait_for_blocking(standby.leads, 30, "the standby to take over")
    c.http = standby.http
    [grace] = await c.events("grace")
    danger_over_at = grace["at"] + GRACE + HB + 1.0

    async def safely_past():
        return time.time() > danger_over_at and await trained_past({r: s + 2 for r, s in before.items()})
    await wait_for_async(safely_past, GRACE + HB + 60, "training past the takeover's danger window", every_s=0.3)

    host = await c.host("spare0")
    assert host["state"] == "ACTIVE" and host["assignment"]["replica_id"] == "r0", host
    assert not host["cordoned"], host
    assert spare.proc.returncode is None, spare.log()[-2000:]
    assert "agent is shutting down" not in spare.log() and "refused host spare0" not in spare.log(), spare.log()[-3000:]
    late = [e for e in await c.events() if e["at"] >= grace["at"] and e["kind"] in ("host_death", "swap", "cordon")]
    assert not late, late  # the new leader declared nobody dead and moved nothing back
    assert len(await c.events("host_death")) == deaths_before
    assert [t for t in on_spare if alive(t)] == on_spare  # the spare's trainers were never stopped
