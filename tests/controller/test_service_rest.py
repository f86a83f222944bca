"""REST admin actions, problem JSON, and orders reaching an agent's stream."""

import asyncio

import grpc
import httpx
import pytest

from protos import controller_pb2 as pb

ADMIN = {"Authorization": "Bearer s3cret"}


async def register(stub, host, *, spare=False, replica=None, ranks=(0,), zone="z1"):
    assignment = pb.Assignment(replica_id=replica, ranks=list(ranks), world_size=1) if replica else None
    return await stub.RegisterAgent(pb.RegisterAgentRequest(
        host_id=host, incarnation=f"{host}-1", spare=spare, slots=8, labels={"zone": zone}, assignment=assignment))


async def test_drain_moves_work_to_spare_and_orders_reach_streams(server, stub):
    h0 = await register(stub, "h0", replica="r0")
    await register(stub, "h1", replica="r1")
    reply = await register(stub, "s0", spare=True)
    assert reply.assignment.replica_id == "" and "spare pool" in reply.reason
    spare_orders = stub.Orders(pb.OrdersRequest(host_id="s0", incarnation="s0-1", agent_secret=reply.agent_secret))
    h0_orders = stub.Orders(pb.OrdersRequest(host_id="h0", incarnation="h0-1", agent_secret=h0.agent_secret))
    # Every stream starts with the host's current assignment (none for the spare).
    first = await asyncio.wait_for(spare_orders.read(), 10)
    assert first.kind == pb.Order.CURRENT and first.assignment.replica_id == ""
    first = await asyncio.wait_for(h0_orders.read(), 10)
    assert first.kind == pb.Order.CURRENT and first.assignment.replica_id == "r0"
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        missing = await http.post("/api/v1/hosts/h0/drain")
        assert missing.status_code == 401 and missing.headers["content-type"] == "application/problem+json"
        wrong = await http.post("/api/v1/hosts/h0/drain", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        assert server.state.hosts["h0"].assignment is not None  # nothing changed
        unknown = await http.post("/api/v1/hosts/ghost/drain", headers=ADMIN)
        assert unknown.status_code == 404 and "host 'ghost' is unknown" in unknown.json()["detail"]
        ok = await http.post("/api/v1/hosts/h0/drain", headers=ADMIN)
        assert ok.status_code == 200 and "host s0 takes replica r0" in ok.json()["result"]
        order = await asyncio.wait_for(spare_orders.read(), 10)
        assert order.kind == pb.Order.ASSIGN and order.assignment.replica_id == "r0"
        stop = await asyncio.wait_for(h0_orders.read(), 10)
        assert stop.kind == pb.Order.STOP and stop.version == order.version - 1 > first.version
        await stub.AckOrder(pb.AckOrderRequest(host_id="s0", order_id=order.order_id, ok=True,
                                               agent_secret=reply.agent_secret))
        hosts = {h["host_id"]: h for h in (await http.get("/api/v1/hosts")).json()}
        assert hosts["h0"]["cordoned"] and hosts["h0"]["cordon_reason"] == "drained by an operator"
        assert hosts["s0"]["assignment"]["replica_id"] == "r0" and not hosts["s0"]["spare"]
        again = await http.post("/api/v1/hosts/h1/drain", headers=ADMIN)
        assert again.status_code == 409 and "no spare is free" in again.json()["detail"]
        metrics = (await http.get("/metrics")).text
        assert 'fthsdp_spare_swaps_total{job_id="t"} 1.0' in metrics
        assert 'fthsdp_hosts_cordoned{job_id="t"} 1.0' in metrics
    spare_orders.cancel()
    h0_orders.cancel()


async def test_bad_agent_requests(server, stub):
    secret = (await register(stub, "h0", replica="r0")).agent_secret
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h0", incarnation="other"))
    # A second incarnation while the first is live waits (retry later), unless it proves it is the same agent.
    assert err.value.code() == grpc.StatusCode.ABORTED and "held by a live agent" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h0", incarnation="other", previous_secret="x" * 43))
    assert err.value.code() == grpc.StatusCode.ABORTED and "Retry later" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await register(stub, "h9", replica="r0")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "duplicate assignment" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportTrainerExit(pb.TrainerExitRequest(host_id="h0", replica_id="r7", rank=0, agent_secret=secret))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not run replica 'r7'" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Orders(pb.OrdersRequest(host_id="h0", incarnation="stale", agent_secret=secret)).read()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "register again" in err.value.details()
    assert set(server.state.hosts) == {"h0"}


async def test_read_endpoints_and_openapi(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        spec = (await http.get("/openapi.json")).json()
        assert {"/api/v1/job", "/api/v1/replicas", "/api/v1/hosts", "/api/v1/quorums", "/api/v1/events"} <= set(spec["paths"])
        assert (await http.get("/docs")).status_code == 200
        bad = await http.get("/api/v1/events", params={"limit": 0})
        assert bad.status_code == 422 and "greater than or equal to 1" in bad.json()["detail"]
        job = (await http.get("/api/v1/job")).json()
        assert job["this_controller_leads"] and job["round"]["reason"] == "no replica has joined this round"
