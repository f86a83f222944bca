"""The agent's gRPC side against an in-process fake controller, with real trainer processes:
registration, orders and acks (including refused ones), exit reports, HA address failover."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest

from agent.runner import PermanentError
from protos import controller_pb2 as pb
from tests.agent.fake_controller import FakeController
from tests.agent.helpers import alive, ready_files, standby_files, wait_for
from tests.sockets import refused_address

O = pb.Order


async def ack(controller: FakeController, order_id: str) -> pb.AckOrderRequest:
    return await wait_for(lambda: controller.acks.get(order_id), 10, f"ack of {order_id}")


async def test_active_host_registers_runs_and_heartbeats(controller, start_agent, tmp_path):
    run = start_agent([controller.address], labels={"zone": "a"})
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    [reg] = controller.registrations
    assert (reg.host_id, reg.spare, reg.slots, dict(reg.labels)) == ("h1", False, 1, {"zone": "a"})
    assert (reg.assignment.replica_id, list(reg.assignment.ranks)) == ("r0", [0])
    assert reg.incarnation == run.agent.incarnation
    await wait_for(lambda: controller.heartbeats["h1"] >= 3, 10, "three heartbeats")
    await run.close()
    assert not alive(info["pid"])


async def test_the_agent_presents_the_secret_of_its_registration(controller, start_agent, tmp_path):
    run = start_agent([controller.address], restart_budget=0)
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    first = controller.secrets[run.agent.incarnation]
    controller.order("h1", "o1", O.START, pb.Assignment(replica_id="r0"))
    await ack(controller, "o1")
    # Forgotten by the controller: a new incarnation, so a new secret, used from then on.
    controller.forget = 1
    await wait_for(lambda: len(controller.secrets) == 2, 10, "a registration as a new incarnation")
    second = controller.secrets[run.agent.incarnation]
    await wait_for(lambda: ("Orders", second) in controller.presented, 10, "the new order stream")
    os.kill(info["pid"], signal.SIGKILL)
    await wait_for(lambda: controller.exits, 10, "exit report")
    assert first != second and set(controller.presented) == {
        ("Orders", first), ("AckOrder", first), ("Orders", second), ("ReportTrainerExit", second)}


async def test_killed_trainer_is_reported_at_once(controller, start_agent, tmp_path):
    start_agent([controller.address], restart_budget=0)
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    os.kill(info["pid"], signal.SIGKILL)
    [e] = await wait_for(lambda: controller.exits, 10, "exit report")
    assert (e.host_id, e.replica_id, e.rank) == ("h1", "r0", 0)
    # Reported with the version it ran under; never "gave up": the controller decides.
    assert (e.exit_code, e.signal, e.gave_up, e.version) == (-1, signal.SIGKILL, False, controller.version)
    assert "trainer ready" in e.stderr_tail


async def test_restart_order_is_executed_then_acked(controller, start_agent, tmp_path):
    start_agent([controller.address])
    [first] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    controller.order("h1", "o1", O.RESTART, pb.Assignment(replica_id="r0"))
    a = await ack(controller, "o1")
    assert (a.ok, a.error) == (True, "")
    assert not alive(first["pid"])
    await wait_for(lambda: len(ready_files(tmp_path)) == 2, 10, "restarted trainer")


@pytest.mark.parametrize("kind,assignment,words", [
    (O.RESTART, pb.Assignment(replica_id="r9", ranks=[0], world_size=2), "unknown replica 'r9'"),
    (O.ASSIGN, pb.Assignment(replica_id="r1", ranks=[0], world_size=2),
     "duplicate assignment of replica 'r1'"),
    (O.KIND_UNSPECIFIED, None, "unknown order kind KIND_UNSPECIFIED"),
])
async def test_bad_orders_are_refused_naming_the_value(controller, start_agent, tmp_path, kind,
                                                      assignment, words):
    run = start_agent([controller.address])
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    controller.order("h1", "bad", kind, assignment)
    a = await ack(controller, "bad")
    assert not a.ok and words in a.error, a.error
    assert run.agent.assignment.replica_id == "r0" and alive(info["pid"])  # nothing changed


async def test_spare_standby_takes_assign_then_release(controller, start_agent, tmp_path):
    run = start_agent([controller.address], spare=True, replica_id="", ranks=(), world_size=0,
                      standby=True)
    [standby] = await wait_for(lambda: standby_files(tmp_path), 10, "standby started")
    assert controller.registrations[0].spare
    controller.order("h1", "o1", O.ASSIGN, pb.Assignment(replica_id="r2", ranks=[1],
                                                         world_size=2))
    assert (await ack(controller, "o1")).ok
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "assigned trainer ready")
    assert info["pid"] == standby["pid"] and info["warm"]
    assert (info["env"]["FTHSDP_REPLICA_ID"], info["env"]["FTHSDP_RANK"]) == ("r2", "1")
    controller.order("h1", "o1", O.ASSIGN, pb.Assignment(replica_id="r2", ranks=[1],
                                                         world_size=2))  # a resent order
    controller.order("h1", "o2", O.RELEASE)
    assert (await ack(controller, "o2")).ok
    assert run.agent.assignment is None and not alive(info["pid"])
    await wait_for(lambda: len(standby_files(tmp_path)) == 2, 10, "a new standby")


async def test_registration_answer_wins(controller, start_agent, tmp_path):
    """A swapped-out host that registers again is told it is a spare: it runs nothing."""
    controller.answer = pb.Assignment()
    run = start_agent([controller.address])
    await wait_for(lambda: run.agent.registered.is_set(), 10, "registration")
    assert run.agent.assignment is None
    await run.agent.supervisor.reconcile()
    assert ready_files(tmp_path) == [] and run.agent.supervisor.slots[0].handle is None


async def test_refused_registration_is_permanent(controller, start_agent):
    controller.refuse = "host h1 is already registered with a live agent"
    run = start_agent([controller.address])
    with pytest.raises(PermanentError, match="already registered"):
        await asyncio.wait_for(run.task, 10)


async def test_a_credential_refusal_ends_the_agent_saying_so(controller, start_agent):
    controller.refuse, controller.refuse_code = "agent secret is wrong", grpc.StatusCode.PERMISSION_DENIED
    run = start_agent([controller.address])
    with pytest.raises(PermanentError, match="does not accept this host's credential: it may not take part"):
        await asyncio.wait_for(run.task, 10)


async def test_a_refused_claim_on_reregistration_keeps_the_trainers_and_asks_without_it(
        controller, start_agent, tmp_path):
    """The chaos finding of issue 28: a registration again (after a failover, after being
    forgotten) whose claim the controller refuses is no reason to stop: the agent asks again
    without the claim and runs what the controller's record says, its trainer untouched."""
    run = start_agent([controller.address])
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    controller.refuse_claims = "host h1 registered as a spare but also claims replica r0 ranks 0."
    controller.answer = pb.Assignment(replica_id="r0", ranks=[0], world_size=2)  # the durable record
    first = len(controller.registrations)
    controller.forget = 1  # the controller lost track of it: it registers again, claiming r0
    await wait_for(lambda: [r for r in controller.registrations[first:] if not r.HasField("assignment")], 10,
                   "a registration without the claim")
    beats = controller.heartbeats["h1"]  # heartbeats after that answer, not the ones before the forget
    await wait_for(lambda: controller.heartbeats["h1"] >= beats + 2 and run.agent.registered.is_set()
                   and run.agent.assignment is not None, 10, "heartbeats under the record's assignment")
    assert not run.task.done()
    assert [r.HasField("assignment") for r in controller.registrations[first:]][:2] == [True, False]
    assert run.agent.assignment is not None and run.agent.assignment.replica_id == "r0"
    assert ready_files(tmp_path) == [info] and alive(info["pid"])  # the same trainer, never stopped


async def test_next_address_is_tried_when_the_first_is_down(controller, start_agent, tmp_path):
    dead = refused_address()  # a port nobody listens on
    start_agent([dead, controller.address])
    await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready via the second address")
    assert controller.registrations


async def test_reconnects_after_the_controller_restarts(start_agent, tmp_path):
    first = await FakeController().start()
    second = await FakeController().start()
    try:
        start_agent([first.address, second.address])
        [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
        await first.stop()
        await wait_for(lambda: second.streams["h1"] == 1, 10, "order stream on the standby")
        assert second.registrations[0].assignment.replica_id == "r0"
        assert alive(info["pid"]) and len(ready_files(tmp_path)) == 1  # trainer kept running
    finally:
        await first.stop()
        await second.stop()


async def test_a_controller_that_is_not_leader_is_left(start_agent, tmp_path):
    standby = await FakeController().start()
    leader = await FakeController().start()
    standby.not_leader = True
    try:
        start_agent([standby.address, leader.address])
        await wait_for(lambda: leader.streams["h1"] == 1, 10, "order stream on the leader")
    finally:
        await standby.stop()
        await leader.stop()


async def test_a_standby_naming_the_leader_sends_the_agent_straight_there(start_agent, tmp_path):
    standby, decoy, leader = [await FakeController().start() for _ in range(3)]
    standby.not_leader, standby.leader_address = True, leader.address
    try:
        start_agent([standby.address, decoy.address, leader.address])
        await wait_for(lambda: leader.streams["h1"] == 1, 10, "order stream on the named leader")
        assert not decoy.registrations  # the address between them was skipped
    finally:
        for fake in (standby, decoy, leader):
            await fake.stop()


async def test_a_controller_that_stops_answering_heartbeats_is_left(start_agent, tmp_path):
    frozen, other = await FakeController().start(), await FakeController().start()
    try:
        run = start_agent([frozen.address, other.address], rpc_timeout_s=0.5)
        [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
        frozen.mute = True  # its connections stay open; it just never answers
        await wait_for(lambda: other.streams["h1"] == 1, 10, "order stream on the other controller")
        assert alive(info["pid"]) and run.agent.assignment.replica_id == "r0"  # the trainer kept running
    finally:
        await frozen.stop()
        await other.stop()


async def test_a_stale_order_is_refused_naming_both_versions(controller, start_agent, tmp_path):
    controller.answer = pb.Assignment(replica_id="r0", ranks=[0], world_size=2, version=7)
    run = start_agent([controller.address])
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    controller.queues["h1"].put_nowait(pb.Order(order_id="old", kind=O.STOP, version=5, reason="superseded"))
    a = await ack(controller, "old")
    assert not a.ok and "its assignment version 5 is older than version 7, which host h1 runs" in a.error
    assert alive(info["pid"]) and run.agent.version == 7
    controller.queues["h1"].put_nowait(pb.Order(order_id="new", kind=O.CURRENT, version=9, reason="moved"))
    assert (await ack(controller, "new")).ok
    await wait_for(lambda: not alive(info["pid"]), 10, "the trainer stopped: the host runs nothing now")
    assert run.agent.assignment is None and run.agent.version == 9


async def test_forgotten_host_registers_again_with_a_new_identity(controller, start_agent,
                                                                  tmp_path):
    run = start_agent([controller.address])
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    first = run.agent.incarnation
    controller.forget = 1
    await wait_for(lambda: len(controller.registrations) == 2, 10, "a second registration")
    assert controller.registrations[1].incarnation not in ("", first)
    assert controller.registrations[1].assignment.replica_id == "r0"
    assert alive(info["pid"]) and len(ready_files(tmp_path)) == 1  # trainer kept running


async def test_an_exit_report_that_fails_is_sent_again(controller, start_agent, tmp_path):
    controller.fail_exits = 1
    start_agent([controller.address], restart_budget=0)
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    os.kill(info["pid"], signal.SIGKILL)
    [e] = await wait_for(lambda: controller.exits, 10, "exit report after a retry")
    assert e.signal == signal.SIGKILL and len(controller.registrations) == 2


async def test_host_with_two_ranks_runs_two_trainers(controller, start_agent, tmp_path):
    start_agent([controller.address], ranks=(0, 1), world_size=2)
    infos = await wait_for(lambda: len(ready_files(tmp_path)) == 2 and ready_files(tmp_path),
                           10, "two trainers")
    assert sorted(i["env"]["FTHSDP_RANK"] for i in infos) == ["0", "1"]
    assert controller.registrations[0].slots == 2


async def test_mtls_to_the_controller_and_the_same_files_for_trainers(start_agent, tmp_path):
    from protos.dial import TlsFiles
    from tests.certs import Authority

    ca = Authority(tmp_path, "ca")
    server, client = ca.issue("server", "controller", True), ca.issue("client", "h1", False)
    creds = grpc.ssl_server_credentials([(server.key.read_bytes(), server.cert.read_bytes())],
                                        root_certificates=ca.pem.cert.read_bytes(),
                                        require_client_auth=True)
    fake = await FakeController().start(creds)
    try:
        tls = TlsFiles(str(ca.pem.cert), str(client.cert), str(client.key)).validate()
        start_agent([fake.address], tls=tls)
        [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready over mTLS")
        assert fake.registrations[0].host_id == "h1"
        assert info["env"]["FTHSDP_TLS_CA_FILE"] == str(ca.pem.cert)
        assert info["env"]["FTHSDP_TLS_KEY_FILE"] == str(client.key)
    finally:
        await fake.stop()


async def test_a_trainer_knows_the_replica_version_it_was_started_under(controller, start_agent, tmp_path):
    """Its hello carries it (fthsdp/step/incarnations.py): race 3 of issue 28."""
    controller.version = 7
    start_agent([controller.address])
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    assert info["env"]["FTHSDP_REPLICA_VERSION"] == "7"
