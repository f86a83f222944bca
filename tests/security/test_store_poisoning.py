"""A store that cannot be poisoned, on a real etcd: writes too large for it are refused before
they are acknowledged, and a leader whose writes keep failing anyway steps down for a standby."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.etcd_server import EtcdServer
from tests.waiting import wait_for_blocking

from protos.credentials import replica_credential

from .harness import HUGE, JOB, SECRET, Legit, expect_refused, open_channel, picture, start_controller

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
BOUND_S = 30


def leads(http_url: str) -> bool:
    try:
        return bool(httpx.get(f"{http_url}/api/v1/job", timeout=2).json()["this_controller_leads"])
    except (httpx.HTTPError, ValueError, KeyError):
        return False


async def health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return reply.status


async def test_writes_too_large_for_etcd_are_refused_up_front_and_the_store_stays_writable(etcd):
    # The job id is the key prefix: a fresh one keeps this test's keys apart.
    # two replicas: r1 is the second (a third replica id would be refused as outside the set)
    ctl = start_controller("--etcd", etcd.endpoint, "--job-id", "poison", "--lease-ttl-s", "2", "--replicas", "2")
    try:
        await wait_for_blocking(lambda: leads(ctl.http), BOUND_S, "the controller to lead")
        channel = await open_channel(ctl.grpc)
        stub = pbg.ControllerStub(channel)
        legit = Legit(stub)
        await legit.register()
        legit_job = "poison"
        # The legitimate leader trains a step (its writes reach etcd).
        q = await stub.Quorum(legit.quorum_request(job_id=legit_job), timeout=10)
        await stub.ReportStep(legit.report(job_id=legit_job, quorum_id=q.quorum_id, step=q.max_step), timeout=10)
        before = await picture(ctl.http)
        # One Quorum whose addresses are each within their bound, but together too large for
        # one etcd write: refused before anything changes.
        fat = ["f" * 217] * 8192
        await expect_refused(stub.Quorum(pb.QuorumRequest(
            job_id=legit_job, replica_id="r9", step=0, world_size=8192, ftar_addresses=fat, state_addresses=fat,
            credential=replica_credential(SECRET, "r9")), timeout=10), grpc.StatusCode.INVALID_ARGUMENT, "the addresses of replica r9 take", "store_max_request_bytes")
        assert await picture(ctl.http) == before
        # A 2 MiB reason for a replica's death is cut, so the write that records it fits. (r1
        # waits in a round that cannot close without r0; its death drops it from the round.)
        joining = asyncio.ensure_future(stub.Quorum(pb.QuorumRequest(
            job_id=legit_job, replica_id="r1", step=1, world_size=1, credential=replica_credential(SECRET, "r1")),
            timeout=10))
        await wait_for_blocking(lambda: "r1" in str(httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5).json()),
                                BOUND_S, "r1 to join")
        await stub.ReportFailure(pb.ReportFailureRequest(job_id=legit_job, replica_id="r1", reason="x" * HUGE,
                                                         kind=pb.ReportFailureRequest.REPLICA_DEAD,
                                                         credential=replica_credential(SECRET, "r1")), timeout=10)
        await expect_refused(joining, grpc.StatusCode.UNAVAILABLE, "r1 was dropped from the round")
        # Every later write still works: r0 commits its next step, and it is durable.
        q = await stub.Quorum(legit.quorum_request(job_id=legit_job, step=q.max_step + 1, known_quorum_id=q.quorum_id),
                              timeout=10)
        await stub.ReportStep(legit.report(job_id=legit_job, quorum_id=q.quorum_id, step=q.max_step), timeout=10)
        reps = {r["replica_id"]: r for r in httpx.get(f"{ctl.http}/api/v1/replicas", timeout=10).json()}
        assert reps["r0"]["committed_step"] == q.max_step and reps["r1"]["state"] == "DEAD"
        assert "more characters cut]" in reps["r1"]["reason"]
        assert await health(ctl.grpc) == health_pb2.HealthCheckResponse.SERVING
        await channel.close()
    finally:
        ctl.stop()


async def test_a_leader_whose_writes_keep_failing_steps_down_for_a_standby(tmp_path):
    """etcd takes at most 64 KiB per request, but the controllers are told 1.5 MiB (a
    misconfiguration): a write that passes the controller's checks really fails in etcd. The
    leader keeps failing (the section is retried on every write), steps down within
    store_failed_writes_to_step_down failures, and the standby, which starts from what etcd
    holds, takes over and serves the legitimate leader."""
    with EtcdServer.start_new(extra_args=("--max-request-bytes", "65536")) as small:
        # two replicas: the poisoned r5 is the second (a third would be refused as outside the set)
        flags = ("--etcd", small.endpoint, "--job-id", JOB, "--lease-ttl-s", "2", "--replicas", "2")
        logs = {name: tmp_path / f"{name}.log" for name in "ab"}
        with open(logs["a"], "w") as err_a, open(logs["b"], "w") as err_b:
            a = start_controller(*flags, stderr=err_a)
            b = start_controller(*flags, stderr=err_b)
        try:
            await wait_for_blocking(lambda: leads(a.http) or leads(b.http), BOUND_S, "a leader")
            leader, standby = (a, b) if leads(a.http) else (b, a)
            channel = await open_channel(leader.grpc)
            stub = pbg.ControllerStub(channel)
            legit = Legit(stub)
            await legit.register()
            await legit.step_once()
            # 256 ranks × 2 addresses of 200 characters: ~100 KiB, fine by the controller's
            # limit, too large for this etcd.
            wide = ["w" * 200] * 256
            await expect_refused(stub.Quorum(pb.QuorumRequest(
                job_id=JOB, replica_id="r5", step=0, world_size=256, ftar_addresses=wide, state_addresses=wide,
                credential=replica_credential(SECRET, "r5")), timeout=10), grpc.StatusCode.UNAVAILABLE, "too large")
            await wait_for_blocking(lambda: leads(standby.http), BOUND_S, "the standby to take over")
            assert await health(leader.grpc) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert not leads(leader.http)
            said = logs["a" if leader is a else "b"].read_text()
            assert "steps down: 5 store writes failed in a row" in said and "request is too large" in said
            await channel.close()
            # The legitimate leader carries on with the new leader, from the durable state.
            channel = await open_channel(standby.grpc)
            legit = await Legit(pbg.ControllerStub(channel), secret=legit.secret).resume(standby.http)
            assert legit.step == 1
            await legit.still_served(standby.http)
            reps = {r["replica_id"] for r in httpx.get(f"{standby.http}/api/v1/replicas", timeout=10).json()}
            assert "r5" not in reps  # the poisoned join never became durable
            await channel.close()
        finally:
            a.stop()
            b.stop()
