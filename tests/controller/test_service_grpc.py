"""The real gRPC server in-process: leaders form quorums step after step, with faults."""

import asyncio

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import controller_pb2 as pb

from .conftest import quorum_request, samples, wait_for

REPLICAS = ("r0", "r1", "r2")


async def round_(stub, steps: dict, **kw):
    calls = [stub.Quorum(quorum_request(rid, step, **kw), timeout=10) for rid, step in steps.items()]
    return dict(zip(steps, await asyncio.gather(*calls)))


async def heartbeat(stub, **ids):
    async def beats():
        yield pb.HeartbeatRequest(**ids)

    return [reply async for reply in stub.Heartbeat(beats())]


async def commit(stub, rid, step, quorum_id):
    await stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id=rid, step=step, quorum_id=quorum_id,
                                               step_time_s=0.1, loss=1.0 / (step + 1), tokens=100))


async def test_quorums_step_after_step_with_failures(server, stub, clock):
    answers = await round_(stub, {r: 0 for r in REPLICAS})
    q1 = answers["r0"]
    base = q1.quorum_id - 1  # a fresh controller counts from its clock: ids never go back
    assert base == int(clock.now * 1000) - 1
    assert {a.quorum_id for a in answers.values()} == {base + 1}
    assert [m.replica_id for m in q1.members] == list(REPLICAS)
    assert q1.addresses_included and q1.members[1].ftar_addresses == ["r1-ftar-0:1", "r1-ftar-1:1"]
    assert q1.lr_scale == 1.0 and q1.total_replicas == 3

    for step in range(1, 4):  # steady state: fast path, same quorum id, addresses left out
        for r in REPLICAS:
            await commit(stub, r, step - 1, base + 1)
        answers = await round_(stub, {r: step for r in REPLICAS}, known_quorum_id=base + 1)
        assert {a.quorum_id for a in answers.values()} == {base + 1}
        assert all(not a.addresses_included and a.reason.startswith("fast path") for a in answers.values())

    # r2 stops heartbeating: after the timeout it is dead and excluded.
    for r in ("r0", "r1"):
        await commit(stub, r, 3, base + 1)
    clock.advance(3.0)
    await heartbeat(stub, replica_ids=["r0", "r1"])
    clock.advance(3.0)
    await wait_for(lambda: server.state.replicas["r2"].state.value == "DEAD", what="r2 declared dead")
    answers = await round_(stub, {"r0": 4, "r1": 4}, known_quorum_id=base + 1)
    q2 = answers["r0"]
    assert q2.quorum_id == base + 2 and [m.replica_id for m in q2.members] == ["r0", "r1"]
    assert q2.addresses_included  # membership changed: fresh addresses
    assert q2.lr_scale == pytest.approx((2 / 3) ** 0.5)

    # r1 reports itself dead: excluded at once, no timeout needed; r2 comes back behind
    # and gets a recovery source, r0 stays healthy.
    await stub.ReportFailure(pb.ReportFailureRequest(job_id="t", replica_id="r1", kind=pb.ReportFailureRequest.REPLICA_DEAD,
                                                     reason="GPU fell off the bus"))
    await commit(stub, "r0", 4, base + 2)
    answers = await round_(stub, {"r0": 5, "r2": 3})
    q3 = answers["r2"]
    assert q3.quorum_id == base + 3 and q3.max_step == 5 and q3.reason == "all 2 live replicas joined"
    assert {m.replica_id: m.healthy for m in q3.members} == {"r0": True, "r2": False}
    assert [(r.replica_id, list(r.sources_by_shard)) for r in q3.recover] == [("r2", ["r0"])]
    assert q3.lr_scale == pytest.approx((1 / 3) ** 0.5)

    # The REST API shows the same picture, and /metrics the gauges.
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        job = (await http.get("/api/v1/job")).json()
        assert job["quorum_id"] == base + 3 and job["replicas_healthy"] == 1 and job["replicas_behind"] == 1
        reps = {r["replica_id"]: r for r in (await http.get("/api/v1/replicas")).json()}
        assert reps["r1"]["state"] == "DEAD" and reps["r1"]["reason"] == "GPU fell off the bus"
        assert reps["r2"]["state"] == "BEHIND"
        quorums = (await http.get("/api/v1/quorums")).json()
        assert [q["quorum_id"] - base for q in quorums["recent"]] == [3, 2, 1]
        events = (await http.get("/api/v1/events")).json()
        assert any("r2 became DEAD: no heartbeat" in e["message"] for e in events)
        metrics = samples((await http.get("/metrics")).text)
        assert metrics[("fthsdp_replicas_healthy", ())] == 1
        assert metrics[("fthsdp_replica_deaths_total", (("cause", "heartbeat"),))] == 1
        assert metrics[("fthsdp_replica_deaths_total", (("cause", "reported"),))] == 1
        assert metrics[("fthsdp_quorum_size", ())] == 2
        # the job's step is a gauge; commits are counted per replica (12 reports in all)
        assert metrics[("fthsdp_job_committed_step", ())] == 4
        assert {r: metrics[("fthsdp_replica_commits_total", (("replica", r),))] for r in REPLICAS} == \
            {"r0": 5, "r1": 4, "r2": 3}
        assert metrics[("fthsdp_quorum_latency_seconds_count", ())] >= 3


async def test_join_timeout_closes_on_the_fake_clock(server, stub, clock):
    await round_(stub, {r: 0 for r in REPLICAS})
    waiting = asyncio.ensure_future(round_(stub, {"r0": 0, "r1": 0}))
    await wait_for(lambda: len(server.state.round_joined) == 2, what="two joiners")
    assert not waiting.done()
    clock.advance(1.5)
    answers = await asyncio.wait_for(waiting, 10)
    assert "join timeout" in answers["r0"].reason and "left out r2" in answers["r0"].reason


async def test_heartbeat_stream_and_unknown_ids(server, stub):
    await round_(stub, {r: 0 for r in REPLICAS})

    replies = await heartbeat(stub, replica_ids=["r0", "nobody"])
    assert [list(r.unknown_ids) for r in replies] == [["nobody"]]


@pytest.mark.parametrize("request_, code, text", [
    (quorum_request("r0", -3), grpc.StatusCode.INVALID_ARGUMENT, "step must not be negative, got -3"),
    (quorum_request("r0", 0, world=0), grpc.StatusCode.INVALID_ARGUMENT, "world_size must be 1..65536, got 0"),
    (quorum_request("", 0), grpc.StatusCode.INVALID_ARGUMENT, "replica_id must not be empty"),
    (pb.QuorumRequest(job_id="other", replica_id="r0", world_size=1), grpc.StatusCode.FAILED_PRECONDITION,
     "job_id 'other'"),
])
async def test_bad_quorum_requests(server, stub, request_, code, text):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Quorum(request_, timeout=5)
    assert err.value.code() == code and text in err.value.details()
    assert server.state.replicas == {} and server.state.round_joined == {}


async def test_bad_reports(server, stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id="ghost", step=1))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "'ghost' is unknown" in err.value.details()
    q = (await round_(stub, {r: 5 for r in REPLICAS}))["r0"]
    await commit(stub, "r0", 5, q.quorum_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await commit(stub, "r0", 6, q.quorum_id)  # not the step it was given
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "quorum answer was" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Quorum(quorum_request("r0", 2), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "committed step 5" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportFailure(pb.ReportFailureRequest(job_id="t", replica_id="r0"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    huge = quorum_request("r0", 6, world=1)
    huge.state_addresses[0] = "x" * 10_000
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Quorum(huge, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "must be 1..256 characters" in err.value.details()
    assert server.state.replicas["r0"].committed_step == 5


async def test_health_service_reports_serving(server):
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "fthsdp.v1.Controller"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
