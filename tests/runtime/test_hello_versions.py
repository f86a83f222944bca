"""Race 3 of issue 28: a trainer restarted on the same host reaches the coordinator of the old
restart while it stops (ports are fixed per host). Real sockets, a real controller process:
the old coordinator (replica version 5) still listens when a rank of version 6 says hello; it
is told to retry, and reaches the new coordinator (version 6) once that one listens on the
same port. A stale rank (version 4) is refused for good; a hello's version is tagged."""

from __future__ import annotations

import threading

import pytest

from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.step import messages as msg
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.controller_client import ControllerClient
from fthsdp.step.coordinator import CoordinatorService
from fthsdp.step.incarnations import stale_hello
from protos import job_secret
from tests.ports import free_port
from tests.trainer_secret import SECRET

WAIT_S = 20.0
KEY = SECRET.key(job_secret.PURPOSE_COORDINATOR)


def start(ctl, version: int, port: int) -> CoordinatorService:
    settings = RuntimeSettings(job_id="versions", replica_id="r0", world_size=2, controller_address=ctl.grpc,
                               quorum_timeout_s=WAIT_S, job_secret=SECRET, replica_version=version)
    return CoordinatorService(settings, ControllerClient(ctl.grpc, "versions", "r0", f"inc{version}"), "127.0.0.1",
                              port).start()


def hello(rank: int, version: int):
    return msg.hello(rank, 2, "versions", "r0", f"127.0.0.1:{1000 + rank}", f"127.0.0.1:{2000 + rank}", "i", version)


def test_the_rule():
    assert stale_hello(0, 7, 1) is None and stale_hello(7, 0, 1) is None and stale_hello(7, 7, 1) is None
    reason, retry = stale_hello(5, 6, 1)
    assert retry and "stopping; try again" in reason
    reason, retry = stale_hello(6, 5, 1)
    assert not retry and "stale process" in reason


def test_a_new_rank_at_the_stopping_coordinator_retries_until_its_own_listens_there(controller_process):
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "versions")
    port = free_port()
    old = start(ctl, 5, port)
    try:
        with pytest.raises(ChannelError, match="older than this coordinator's 5: a stale process"):
            CoordinatorClient(old.address, 1).connect(WAIT_S, hello(1, 4), KEY)
        # The restarted rank 1 (version 6) keeps being told to retry while the old one listens...
        with pytest.raises(ChannelError, match="could not reach its coordinator .* within 1s"):
            CoordinatorClient(old.address, 1).connect(1.0, hello(1, 6), KEY)
        assert old._core.hellos == {}  # it never joined the old restart
        new_one: list[CoordinatorService] = []

        def replace_coordinator() -> None:
            old.close()
            new_one.append(start(ctl, 6, port))  # the new rank 0's, at the same fixed port

        client = CoordinatorClient(old.address, 1)
        swap = threading.Timer(0.5, replace_coordinator)
        swap.start()
        client.connect(WAIT_S, hello(1, 6), KEY)  # ...and reaches the new one
        swap.join(WAIT_S)
        assert new_one and new_one[0].address == old.address
        assert new_one[0]._core.hellos.keys() == {1}
        client.close()
    finally:
        old.close()
        for svc in locals().get("new_one", []):
            svc.close()


def test_the_version_is_tagged_so_a_stranger_cannot_change_it():
    signed = msg.sign_hello(KEY, hello(1, 6), b"n" * 16)
    forged = type(signed)()
    forged.CopyFrom(signed)
    forged.hello.replica_version = 5
    assert msg.hello_is_authentic(KEY, signed.hello, b"n" * 16)
    assert not msg.hello_is_authentic(KEY, forged.hello, b"n" * 16)
