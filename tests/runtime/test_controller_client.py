"""The coordinator's controller client against real controller processes: failover, refusals."""

import dataclasses

import pytest

from fthsdp.errors import ControllerRefused, ControllerUnavailable
from fthsdp.step import coordination as co
from fthsdp.step.controller_client import ControllerClient
from tests.sockets import refused_address
from tests.waiting import wait_until

REQUEST = co.RequestQuorum(0, 0, ("127.0.0.1:1",), ("127.0.0.1:2",))


@pytest.fixture
def controller(controller_process):
    return controller_process("--replicas", "1", "--job-id", "cc")


def dead_address() -> str:
    return refused_address()  # bound, never listening: nothing answers there


def test_quorum_fails_over_past_dead_controllers_to_a_live_one(controller):
    client = ControllerClient(f"{dead_address()},{dead_address()},{controller.grpc}", "cc", "r0", "inc-1")
    try:
        answer = client.quorum(REQUEST, 1, "", timeout_s=20)
        assert answer.members[0].replica_id == "r0" and answer.addresses_included
        assert client.address == controller.grpc
        # the next call goes straight to the live one and the addresses are not sent again
        client.report_step(co.ReportStep(answer.quorum_id, 0, 0.1, 1.0, 8, "", False))
        assert client.address == controller.grpc
    finally:
        client.close()


def test_heartbeats_fail_over_on_their_own_while_no_call_moves(controller):
    """A replica with nothing to ask (a long step, inner steps between syncs) still reaches the
    live controller: its heartbeat stream does not wait for a call to fail over first (before,
    it followed only the calls' channel and beat at a dead leader until the new one declared
    the replica dead)."""
    dead = dead_address()
    client = ControllerClient(f"{dead},{controller.grpc}", "cc", "r0", "inc-1")
    try:
        client.start_heartbeats(0.05)
        wait_until(lambda: client.heartbeats_answered >= 2, 20, "the live controller to answer heartbeats")
        assert client.heartbeat_address == controller.grpc
        assert client.address == dead  # no call was made: the calls did not move
    finally:
        client.close()


def test_no_live_controller_is_a_recoverable_error_naming_every_address():
    a, b = dead_address(), dead_address()
    client = ControllerClient(f"{a},{b}", "cc", "r0", "inc-1")
    try:
        with pytest.raises(ControllerUnavailable, match=f"no answer within 0.5s from {a}, {b}: last UNAVAILABLE"):
            client.quorum(REQUEST, 1, "", timeout_s=0.5)
    finally:
        client.close()


def test_refusals_are_fatal_and_not_retried(controller):
    client = ControllerClient(controller.grpc, "other-job", "r0", "inc-1")
    try:
        with pytest.raises(ControllerRefused, match="FAILED_PRECONDITION.*job_id 'other-job'"):
            client.quorum(REQUEST, 1, "", timeout_s=20)
    finally:
        client.close()


def test_bad_address_list_is_refused():
    with pytest.raises(ValueError, match="controller address 'nope' is not host:port"):
        ControllerClient("nope", "cc", "r0", "inc-1")


def test_reports_name_the_leaders_host_where_an_agent_holds_rank_0(controller, monkeypatch):
    """The controller fences leaders by host once an agent holds rank 0: every report must name it."""
    import grpc

    from protos import controller_pb2 as pb
    from protos import controller_pb2_grpc as pbg

    with grpc.insecure_channel(controller.grpc) as channel:
        pbg.ControllerStub(channel).RegisterAgent(pb.RegisterAgentRequest(
            host_id="h0", incarnation="agent-1", slots=1,
            assignment=pb.Assignment(replica_id="r0", ranks=[0], world_size=1)), timeout=10)
    monkeypatch.setenv("FTHSDP_HOST_ID", "h0")
    client = ControllerClient(controller.grpc, "cc", "r0", "inc-1")
    try:
        answer = client.quorum(REQUEST, 1, "", timeout_s=20)
        client.report_failure(co.ReportFailure(answer.quorum_id, 0, "injected", False))
        answer = client.quorum(REQUEST, 1, "", timeout_s=20)
        client.report_step(co.ReportStep(answer.quorum_id, 0, 0.1, 1.0, 8, "", False))
    finally:
        client.close()
    monkeypatch.setenv("FTHSDP_HOST_ID", "h9")
    stranger = ControllerClient(controller.grpc, "cc", "r0", "inc-1")
    try:
        with pytest.raises(ControllerRefused, match="host h9 does not hold rank 0 of replica r0"):
            stranger.report_failure(co.ReportFailure(answer.quorum_id, 1, "injected", False))
    finally:
        stranger.close()


def test_quorums_ride_one_stream_and_a_dead_controllers_stream_is_replaced_on_the_next(controller_process):
    """Rounds reuse one QuorumStream; a SIGKILLed controller breaks it, and the next round opens
    a new stream on the address the rotation moved to (the answer still comes in time)."""
    first = controller_process("--replicas", "1", "--job-id", "cc", "--no-quorum-port")
    second = controller_process("--replicas", "1", "--job-id", "cc", "--no-quorum-port")
    client = ControllerClient(f"{first.grpc},{second.grpc}", "cc", "r0", "inc-1")
    try:
        answer = client.quorum(REQUEST, 1, "", timeout_s=20)
        assert answer.quorum_address == "" and first.quorum == ""
        stream = client._quorum_stream._call
        assert stream is not None and answer.addresses_included
        client.report_step(co.ReportStep(answer.quorum_id, 0, 0.1, 1.0, 8, "", False))
        again = client.quorum(dataclasses.replace(REQUEST, step=1, known_quorum_id=answer.quorum_id), 1, "", timeout_s=20)
        assert again.quorum_id == answer.quorum_id and not again.addresses_included  # sent once
        assert client._quorum_stream._call is stream and client.address == first.grpc
        first.proc.kill()
        first.proc.wait(10)
        moved = client.quorum(dataclasses.replace(REQUEST, step=1, known_quorum_id=again.quorum_id), 1, "", timeout_s=20)
        assert client.address == second.grpc and moved.members[0].replica_id == "r0"
        assert moved.addresses_included  # the new controller did not know them: sent again
        assert client._quorum_stream._call not in (None, stream)
    finally:
        client.close()
    assert not client._quorum_stream.open


def test_quorums_move_to_the_quorum_port_and_back_to_the_stream_when_it_is_gone(controller_process):
    """The first answer (on the stream) names the leader's quorum port; the next rounds go
    there and the stream is closed. A SIGKILLed controller takes its port along: the round
    falls back to the stream, which fails over to the next controller, whose port it then uses."""
    first = controller_process("--replicas", "1", "--job-id", "cc")
    second = controller_process("--replicas", "1", "--job-id", "cc")
    client = ControllerClient(f"{first.grpc},{second.grpc}", "cc", "r0", "inc-1")
    try:
        answer = client.quorum(REQUEST, 1, "", timeout_s=20)
        assert answer.quorum_address == first.quorum != "" and client._quorum_stream.open
        client.report_step(co.ReportStep(answer.quorum_id, 0, 0.1, 1.0, 8, "", False))
        again = client.quorum(dataclasses.replace(REQUEST, step=1, known_quorum_id=answer.quorum_id), 1, "", timeout_s=20)
        assert again.quorum_id == answer.quorum_id and not again.addresses_included  # sent once
        assert client._port.open and not client._quorum_stream.open  # on the port now
        first.proc.kill()
        first.proc.wait(10)
        moved = client.quorum(dataclasses.replace(REQUEST, step=1, known_quorum_id=again.quorum_id), 1, "", timeout_s=20)
        assert client.address == second.grpc and moved.addresses_included  # sent again to the new one
        assert moved.quorum_address == second.quorum and client._port_address == f"127.0.0.1{second.quorum}"
        client.report_step(co.ReportStep(moved.quorum_id, 1, 0.1, 1.0, 8, "", False))
        last = client.quorum(dataclasses.replace(REQUEST, step=2, known_quorum_id=moved.quorum_id), 1, "", timeout_s=20)
        assert last.max_step == 2 and client._port.open and not client._quorum_stream.open
        assert f"127.0.0.1{first.quorum}" in client._port_failed_at  # not asked again for a while
    finally:
        client.close()
    assert not client._port.open


def test_a_step_report_names_the_newest_checkpoint_only_when_there_is_one(controller):
    import httpx

    client = ControllerClient(controller.grpc, "cc", "r0", "inc-1")
    try:
        answer = client.quorum(REQUEST, 1, "", timeout_s=20)
        client.report_step(co.ReportStep(answer.quorum_id, 0, 0.1, 1.0, 8, "", False))
        assert httpx.get(f"{controller.http}/api/v1/job", timeout=5).json()["newest_checkpoint_step"] == -1
        answer = client.quorum(co.RequestQuorum(1, answer.quorum_id, (), ()), 1, "", timeout_s=20)
        client.report_step(co.ReportStep(answer.quorum_id, 1, 0.1, 1.0, 8, "", False, "", checkpoint_step=0))
        assert httpx.get(f"{controller.http}/api/v1/job", timeout=5).json()["newest_checkpoint_step"] == 0
    finally:
        client.close()
