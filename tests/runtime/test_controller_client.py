"""The coordinator's controller client against real controller processes: failover, refusals."""

import socket

import pytest

from fthsdp.errors import ControllerRefused, ControllerUnavailable
from fthsdp.step import coordination as co
from fthsdp.step.controller_client import ControllerClient

REQUEST = co.RequestQuorum(0, 0, ("127.0.0.1:1",), ("127.0.0.1:2",))


@pytest.fixture
def controller(controller_process):
    return controller_process("--replicas", "1", "--job-id", "cc")


def dead_address() -> str:
    with socket.socket() as s:  # bound and closed: nothing listens there now
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


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
