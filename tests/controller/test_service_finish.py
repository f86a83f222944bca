"""The real gRPC server in-process: replicas finish, the job completes, and a failover keeps it."""

import asyncio

import grpc
import httpx
import pytest

from controller.core.model import JobState, ReplicaState
from controller.service.server import ControllerServer
from controller.store import MemoryStore
from protos import controller_pb2 as pb

from .conftest import quorum_request, samples

REPLICAS = ("r0", "r1", "r2")


async def heartbeat(stub, **ids):
    async def beats():
        yield pb.HeartbeatRequest(**ids)

    [reply] = [r async for r in stub.Heartbeat(beats())]
    return reply


def host(rid: str) -> str:
    """The host running rank 0 of replica r<i> (with agents): h<i>."""
    return f"h{rid[1:]}"


async def start(stub, hosts=True) -> dict[str, str]:
    """Hosts h<i> run rank 0 of r<i>; one quorum at step 0, committed by all. Returns the
    agents' secrets by host."""
    secrets = {}
    if hosts:
        for i, rid in enumerate(REPLICAS):
            reply = await stub.RegisterAgent(pb.RegisterAgentRequest(
                host_id=f"h{i}", incarnation=f"h{i}-1", assignment=pb.Assignment(replica_id=rid, ranks=[0],
                                                                                world_size=2)))
            assert reply.job_state == pb.RUNNING
            secrets[f"h{i}"] = reply.agent_secret
    leaders = {rid: host(rid) if hosts else "" for rid in REPLICAS}
    answers = await asyncio.gather(*(stub.Quorum(quorum_request(r, 0, incarnation="one", host_id=leaders[r]),
                                                 timeout=10) for r in REPLICAS))
    for rid in REPLICAS:
        await stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id=rid, step=0, host_id=leaders[rid],
                                                   quorum_id=answers[0].quorum_id))
    return secrets


def finished(rid, step=0, **kw):
    return pb.ReportFinishedRequest(job_id="t", replica_id=rid, step=step, **kw)


async def test_replicas_finish_and_the_job_completes(server, stub):
    secrets = await start(stub)
    reply = await stub.ReportFinished(finished("r0", host_id="h0", reason="max_steps reached"))
    assert reply.job_state == pb.RUNNING
    assert (await heartbeat(stub, host_ids=["h0"])).job_state == pb.RUNNING
    # r0 is not waited for: r1 and r2 form the next quorum at once.
    q = await asyncio.wait_for(asyncio.gather(*(stub.Quorum(quorum_request(r, 1, incarnation="one", host_id=host(r)))
                                                for r in ("r1", "r2"))), 10)
    assert [m.replica_id for m in q[0].members] == ["r1", "r2"]
    # r0's trainer exits 0 after its replica finished: a normal end.
    await stub.ReportTrainerExit(pb.TrainerExitRequest(host_id="h0", replica_id="r0", rank=0, exit_code=0,
                                                       agent_secret=secrets["h0"]))
    assert server.state.replicas["r0"].state == ReplicaState.FINISHED and server.state.deaths == {}
    # r1's trainer exits 0 before its replica finished: a death.
    await stub.ReportTrainerExit(pb.TrainerExitRequest(host_id="h1", replica_id="r1", rank=0, exit_code=0,
                                                       agent_secret=secrets["h1"]))
    assert server.state.replicas["r1"].state == ReplicaState.DEAD
    reply = await stub.ReportFinished(finished("r2", step=1, host_id="h2"))
    assert reply.job_state == pb.COMPLETED

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Quorum(quorum_request("r1", 0, incarnation="two", host_id="h1"), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "COMPLETED" in err.value.details()
    assert (await heartbeat(stub, host_ids=["h0"])).job_state == pb.COMPLETED
    again = await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h9", incarnation="h9-1", spare=True))
    assert again.job_state == pb.COMPLETED

    async with httpx.AsyncClient(base_url=server.http_url) as http:
        job = (await http.get("/api/v1/job")).json()
        assert (job["job_state"], job["replicas_finished"], job["replicas_dead"]) == ("COMPLETED", 2, 1)
        assert job["completed_at"] == server.clock.now
        assert job["round"]["reason"] == "the job is COMPLETED"
        reps = {r["replica_id"]: r for r in (await http.get("/api/v1/replicas")).json()}
        assert reps["r0"]["state"] == "FINISHED" and reps["r0"]["reason"] == "finished after step 0: max_steps reached"
        events = [e["message"] for e in (await http.get("/api/v1/events")).json()]
        assert "replica r0 finished: trainer rank 0 on host h0 exited with code 0" in events
        assert 'job "t" COMPLETED: 2 replica(s) finished, 1 dead' in events
        assert any("exited cleanly before its replica finished" in m for m in events)
        metrics = samples((await http.get("/metrics")).text)
        assert metrics[("fthsdp_job_completed", ())] == 1
        assert metrics[("fthsdp_replicas", (("state", "FINISHED"),))] == 2
        assert metrics[("fthsdp_replica_deaths_total", (("cause", "trainer_exit"),))] == 1


async def test_a_restarted_replicas_join_after_the_others_finished_is_refused_at_once(server, stub):
    """Issue 39, finding 4: r1 restarts (a new incarnation) after r0 and r2 finished. Its join
    ends the old process, which completes the job: the join is answered at once with the
    COMPLETED refusal (it used to wait in a round that never closes until its own timeout), and
    REST shows r1 DEAD, not JOINING, in the COMPLETED job."""
    await start(stub)
    for rid in ("r0", "r2"):
        await stub.ReportFinished(finished(rid, host_id=host(rid)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Quorum(quorum_request("r1", 0, incarnation="restarted", host_id="h1"), timeout=30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
    assert 'job "t" is COMPLETED' in err.value.details()
    assert server.state.job_state == JobState.COMPLETED and server.state.replicas["r1"].state == ReplicaState.DEAD
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reps = {r["replica_id"]: r["state"] for r in (await http.get("/api/v1/replicas")).json()}
    assert reps == {"r0": "FINISHED", "r1": "DEAD", "r2": "FINISHED"}


@pytest.mark.parametrize("request_, code, text", [
    (finished("ghost"), grpc.StatusCode.FAILED_PRECONDITION, "replica 'ghost' is unknown"),
    (pb.ReportFinishedRequest(job_id="other", replica_id="r0"), grpc.StatusCode.FAILED_PRECONDITION,
     "job_id 'other' does not match"),
    (finished("r0", host_id="h1"), grpc.StatusCode.FAILED_PRECONDITION, "host h1 does not hold rank 0 of replica r0"),
    (finished("r0"), grpc.StatusCode.FAILED_PRECONDITION, "r0's coordinator named no host_id"),
    (finished("r0", step=-5, host_id="h0"), grpc.StatusCode.INVALID_ARGUMENT, "got -5"),
    (finished("r0", step=2**40, host_id="h0"), grpc.StatusCode.FAILED_PRECONDITION, "no quorum gave it a step after 0"),
])
async def test_bad_finish_reports_are_refused(server, stub, request_, code, text):
    await start(stub)
    before = {rid: (r.state, r.reason) for rid, r in server.state.replicas.items()}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportFinished(request_, timeout=5)
    assert err.value.code() == code and text in err.value.details()
    assert {rid: (r.state, r.reason) for rid, r in server.state.replicas.items()} == before
    assert server.state.job_state == JobState.RUNNING


async def test_finished_states_survive_a_failover(settings, clock):
    store = MemoryStore()
    first = ControllerServer(settings, clock=clock, store=store)
    await first.start()
    await first.wait_leading(10)
    try:
        async with grpc.aio.insecure_channel(first.grpc_address) as channel:
            from protos import controller_pb2_grpc as pbg
            stub = pbg.ControllerStub(channel)
            await start(stub, hosts=False)
            for rid in REPLICAS:
                await stub.ReportFinished(finished(rid))
    finally:
        await first.stop()
    second = ControllerServer(settings, clock=clock, store=store)
    await second.start()
    try:
        await second.wait_leading(10)
        assert second.state.job_state == JobState.COMPLETED
        assert {r.state for r in second.state.replicas.values()} == {ReplicaState.FINISHED}
    finally:
        await second.stop()
