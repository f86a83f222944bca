"""The real gRPC server in-process: the controller's layout over the wire, clean agent stops,
restarted agents, and a round that drops a leader who hung up."""

import asyncio

import grpc
import pytest

from controller.settings import ControllerSettings
from protos import controller_pb2 as pb

from .conftest import quorum_request, wait_for


@pytest.fixture
def settings():
    return ControllerSettings(job_id="t", replicas=2, min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=5.0,
                              hosts_per_replica=2, ranks_per_host=1)


async def register(stub, host, *, incarnation=None, spare=False, address=None, previous_secret=""):
    return await stub.RegisterAgent(pb.RegisterAgentRequest(
        host_id=host, incarnation=incarnation or f"{host}-1", spare=spare, slots=1,
        address=address or f"10.1.0.{host[-1]}", rendezvous_port=29500, coordinator_port=29501,
        previous_secret=previous_secret))


async def test_the_layout_over_the_wire_and_a_clean_stop(server, stub):
    n0, n1 = await register(stub, "n0"), await register(stub, "n1")
    # Available agents take the controller's layout; every rank of r0 meets at n0.
    assert (n0.assignment.replica_id, list(n0.assignment.ranks), n0.assignment.world_size) == ("r0", [0], 2)
    assert (n1.assignment.replica_id, list(n1.assignment.ranks)) == ("r0", [1])
    for reply in (n0, n1):
        assert (reply.assignment.rendezvous_address, reply.assignment.coordinator_address) == (
            "10.1.0.0:29500", "10.1.0.0:29501")
    spare = await register(stub, "s9", spare=True)
    assert spare.assignment.replica_id == ""
    n0_orders = stub.Orders(pb.OrdersRequest(host_id="n0", incarnation="n0-1", agent_secret=n0.agent_secret))
    assert (await asyncio.wait_for(n0_orders.read(), 10)).kind == pb.Order.CURRENT

    # Only n1's agent (its secret, its incarnation) may deregister n1.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.DeregisterAgent(pb.DeregisterAgentRequest(host_id="n1", incarnation="n1-1",
                                                             agent_secret=n0.agent_secret, reason="x"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert server.state.hosts["n1"].state.value == "ACTIVE"
    await stub.DeregisterAgent(pb.DeregisterAgentRequest(host_id="n1", incarnation="n1-1",
                                                         agent_secret=n1.agent_secret, reason="SIGTERM"))
    assert server.state.hosts["n1"].state.value == "DEAD"
    assert server.state.hosts["s9"].assignment.ranks == (1,)
    # n0 restarts its rank with the spare, under the spare's new version, meeting at n0 still.
    order = await asyncio.wait_for(n0_orders.read(), 10)
    assert order.kind == pb.Order.RESTART and order.version == server.state.hosts["s9"].assignment_version
    assert order.assignment.rendezvous_address == "10.1.0.0:29500"
    # n1's next agent registers at once; its work moved, so it takes the layout's next free slot.
    again = await register(stub, "n1", incarnation="n1-2")
    assert (again.assignment.replica_id, list(again.assignment.ranks)) == ("r1", [0]) and again.agent_secret
    n0_orders.cancel()


async def test_a_restarted_agent_waits_unless_it_proves_it_is_the_same(server, stub):
    n0 = await register(stub, "n0")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await register(stub, "n0", incarnation="n0-2")
    assert err.value.code() == grpc.StatusCode.ABORTED and "Retry later" in err.value.details()
    taken = await register(stub, "n0", incarnation="n0-2", previous_secret=n0.agent_secret)
    assert taken.assignment.replica_id == "r0" and "taken over" in taken.reason
    assert taken.agent_secret and taken.agent_secret != n0.agent_secret
    assert server.state.hosts["n0"].incarnation == "n0-2"


async def test_a_leader_that_hangs_up_leaves_the_open_round(server, stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Quorum(quorum_request("r0", 0, world=1), timeout=0.5)  # min_replicas is 2: no answer
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_for(lambda: "r0" not in server.state.round_joined, what="r0 dropped from the round")
    assert any(e.kind == "replica" and "r0 left the open round: its coordinator's Quorum call ended" in e.message
               for e in server.state.events)
    call = stub.Quorum(quorum_request("r1", 0, world=1), timeout=10)
    await wait_for(lambda: "r1" in server.state.round_joined, what="r1 joined")
    assert server.state.round_reason == "waiting: 1 joined (r1), min_replicas is 2; missing r0"
    call.cancel()
    await wait_for(lambda: not server.state.round_joined, what="r1 dropped too")
