"""A trainer's listeners never share a port (issue 39, finding 1): the FTAR/state-server
listener and the replica coordinator refuse a port another socket listens on, naming it."""

from __future__ import annotations

import socket
import threading

import pytest

from fthsdp.settings import RuntimeSettings
from fthsdp.step.controller_client import ControllerClient
from fthsdp.step.coordinator import CoordinatorService
from ftar_kernels.transport import TcpTransport
from tests.trainer_secret import SECRET


@pytest.fixture
def taken_port():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def test_the_ftar_listener_refuses_a_taken_port(taken_port):
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken_port}: Address already in use"):
        TcpTransport().listen("127.0.0.1", taken_port)


def test_the_coordinator_refuses_a_taken_port_and_leaves_no_thread(taken_port):
    settings = RuntimeSettings(job_id="ports", replica_id="r0", world_size=1, controller_address="127.0.0.1:9",
                               coordinator_address=f"127.0.0.1:{taken_port}", job_secret=SECRET)
    service = CoordinatorService(settings, ControllerClient("127.0.0.1:9", "ports", "r0", "inc"), "127.0.0.1",
                                 taken_port)
    with pytest.raises(OSError, match=f"{taken_port}.*address already in use"):
        service.start()
    assert not [t for t in threading.enumerate() if t.name == "coordinator-r0"]
