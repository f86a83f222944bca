"""Highly-available controller on a real etcd: SIGKILL, SIGSTOP, etcd restart."""

import asyncio
import signal

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.etcd_server import EtcdServer

from tests.waiting import wait_for_blocking as wait_until

from .cluster import JOB, ControllerProcess, LeaderLog, train

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
REPLICAS = ("r0", "r1", "r2")


@pytest.fixture
def etcd_private():
    server = EtcdServer.start_new()
    yield server
    server.close()


@pytest.fixture
def pair(etcd_private):
    a = ControllerProcess(etcd_private.endpoint, name="a").start()
    b = ControllerProcess(etcd_private.endpoint, name="b").start()
    yield a, b
    a.stop()
    b.stop()


def committed(controller: ControllerProcess) -> dict[str, int]:
    reps = httpx.get(f"{controller.http}/api/v1/replicas", timeout=5).json()
    return {r["replica_id"]: r["committed_step"] for r in reps}


async def run_leaders(addresses, logs, stop):
    return await asyncio.gather(*(train(addresses, rid, logs[rid], stop) for rid in REPLICAS))


async def progress(logs, beyond: int, timeout_s: float):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while min((log.acked_steps[-1] if log.acked_steps else -1) for log in logs.values()) < beyond:
        assert asyncio.get_running_loop().time() < deadline, {r: l.acked_steps[-3:] for r, l in logs.items()}
        assert not any(log.errors for log in logs.values()), {r: l.errors for r, l in logs.items()}
        await asyncio.sleep(0.05)


async def stop_leaders(task, stop):
    """Stop the simulated leaders. One may be waiting in a round the others will not join
    any more, so whatever has not finished shortly is cancelled."""
    stop.set()
    try:
        await asyncio.wait_for(asyncio.shield(task), 5)
    except asyncio.TimeoutError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def assert_committed_matches(controller, logs):
    after = committed(controller)
    for r, log in logs.items():  # every acknowledged step is there; nothing beyond what was sent
        assert log.acked_steps[-1] <= after[r] <= log.sent_step, (r, after[r], log.acked_steps[-3:], log.sent_step)
    return after


def assert_monotonic(logs):
    for log in logs.values():
        assert log.quorum_ids == sorted(log.quorum_ids), f"{log.replica_id} saw quorum ids go back"
        assert log.acked_steps == sorted(log.acked_steps)


async def test_sigkill_of_the_active_controller_loses_no_committed_step(pair):
    a, b = pair
    await wait_until(lambda: a.leads() or b.leads(), 20, "a leader")
    leader, standby = (a, b) if a.leads() else (b, a)
    assert not standby.leads()
    logs = {r: LeaderLog(r) for r in REPLICAS}
    stop = asyncio.Event()
    task = asyncio.ensure_future(run_leaders([leader.grpc, standby.grpc], logs, stop))
    await progress(logs, 5, 30)
    # The standby serves the read-only API from the store and is NOT_SERVING on gRPC health.
    assert set(committed(standby)) == set(REPLICAS)
    async with grpc.aio.insecure_channel(standby.grpc) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    acked_before = {r: log.acked_steps[-1] for r, log in logs.items()}
    leader.signal(signal.SIGKILL)
    await wait_until(standby.leads, 30, "the standby to take over")
    await progress(logs, max(acked_before.values()) + 5, 30)
    await stop_leaders(task, stop)
    after = assert_committed_matches(standby, logs)
    for r in REPLICAS:  # every step a leader got acknowledged before the kill survived it
        assert after[r] >= acked_before[r]
    assert_monotonic(logs)


async def test_a_paused_leader_is_deposed_and_its_writes_are_refused(pair):
    a, b = pair
    await wait_until(lambda: a.leads() or b.leads(), 20, "a leader")
    leader, standby = (a, b) if a.leads() else (b, a)
    logs = {r: LeaderLog(r) for r in REPLICAS}
    stop = asyncio.Event()
    task = asyncio.ensure_future(run_leaders([leader.grpc, standby.grpc], logs, stop))
    await progress(logs, 3, 30)
    leader.signal(signal.SIGSTOP)
    await wait_until(standby.leads, 30, "the standby to take over")
    await progress(logs, max(log.acked_steps[-1] for log in logs.values()) + 3, 30)
    await stop_leaders(task, stop)
    leader.signal(signal.SIGCONT)
    # Straight after waking, the old leader may still believe it leads: its write must be refused.
    async with grpc.aio.insecure_channel(leader.grpc) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pbg.ControllerStub(channel).ReportStep(
                pb.ReportStepRequest(job_id=JOB, replica_id="r0", step=99_999, quorum_id=1), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert committed(standby)["r0"] != 99_999
    await wait_until(lambda: leader.job() and not leader.job()["this_controller_leads"], 20,
                     "the old leader to know it no longer leads")
    assert standby.leads()
    assert_monotonic(logs)


async def test_etcd_restart_is_survived_without_an_operator(etcd_private):
    c = ControllerProcess(etcd_private.endpoint, name="solo").start()
    try:
        await wait_until(c.leads, 20, "the controller to lead")
        logs = {r: LeaderLog(r) for r in REPLICAS}
        stop = asyncio.Event()
        task = asyncio.ensure_future(run_leaders([c.grpc], logs, stop))
        await progress(logs, 3, 30)
        etcd_private.kill()
        etcd_private.restart()
        await progress(logs, max(log.acked_steps[-1] for log in logs.values()) + 5, 40)
        await stop_leaders(task, stop)
        assert c.leads()
        assert_committed_matches(c, logs)
        assert_monotonic(logs)
    finally:
        c.stop()
