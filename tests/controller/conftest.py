"""In-process controller on OS-chosen loopback ports, with a clock the test moves."""

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.service.server import ControllerServer
from controller.settings import ControllerSettings
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.waiting import wait_for  # noqa: F401 - used by the tests through this module


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def settings():
    return ControllerSettings(job_id="t", replicas=3, min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=5.0)


@pytest.fixture
async def server(settings, clock):
    srv = ControllerServer(settings, clock=clock, admin_token="s3cret")
    await srv.start()
    await srv.wait_leading(10)
    yield srv
    await srv.stop()


@pytest.fixture
async def stub(server):
    channel = grpc.aio.insecure_channel(server.grpc_address)
    yield pbg.ControllerStub(channel)
    await channel.close()


def quorum_request(rid: str, step: int, world: int = 2, **kw) -> pb.QuorumRequest:
    return pb.QuorumRequest(job_id="t", replica_id=rid, step=step, world_size=world,
                            ftar_addresses=[f"{rid}-ftar-{k}:1" for k in range(world)],
                            state_addresses=[f"{rid}-state-{k}:2" for k in range(world)], **kw)


def samples(text: str, job_id: str = "t") -> dict:
    """Prometheus text as {(sample name, sorted labels without job_id): value}; every sample
    must carry this controller's job_id."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("job_id", None) == job_id, s
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out
