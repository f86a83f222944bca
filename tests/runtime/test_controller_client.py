"""The leader's controller client moves past a dead controller address to a live one."""

import socket

import pytest

from fthsdp.controller_client import ControllerClient, ControllerError


@pytest.fixture
def controller(controller_process):
    return controller_process("--replicas", "1", "--job-id", "cc")


def dead_address() -> str:
    with socket.socket() as s:  # bound and closed: nothing listens there now
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_quorum_fails_over_to_the_next_controller(controller):
    client = ControllerClient(f"{dead_address()},{controller.grpc}", "cc", "r0", "inc-1")
    try:
        view = client.quorum(0, 1, ["127.0.0.1:1"], ["127.0.0.1:2"], "", timeout_s=20)
        assert view.members[0].replica_id == "r0" and client.address == controller.grpc
    finally:
        client.close()


def test_refusals_are_not_retried(controller):
    client = ControllerClient(controller.grpc, "other-job", "r0", "inc-1")
    try:
        with pytest.raises(ControllerError, match="FAILED_PRECONDITION.*job_id 'other-job'"):
            client.quorum(0, 1, ["127.0.0.1:1"], ["127.0.0.1:2"], "", timeout_s=20)
    finally:
        client.close()


def test_bad_address_list_is_refused():
    with pytest.raises(ValueError, match="controller address 'nope' is not host:port"):
        ControllerClient("nope", "cc", "r0", "inc-1")
