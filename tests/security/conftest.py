"""One real controller process per module, with its legitimate agent (h0) registered."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from controller.launch import ControllerProcess
from protos import controller_pb2_grpc as pbg

from .harness import Legit, open_channel, register_request, start_controller

ADMIN_TOKEN = "s3cret-admin"


@dataclass
class Target:
    ctl: ControllerProcess
    secret: str

    async def legit(self, channel) -> Legit:
        return await Legit(pbg.ControllerStub(channel), secret=self.secret).resume(self.ctl.http)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    token = tmp_path_factory.mktemp("sec") / "admin-token"
    token.write_text(ADMIN_TOKEN)
    ctl = start_controller("--admin-token-file", str(token))
    try:
        with grpc.insecure_channel(ctl.grpc) as channel:
            reply = pbg.ControllerStub(channel).RegisterAgent(register_request(), timeout=10)
        yield Target(ctl, reply.agent_secret)
    finally:
        ctl.stop()


@pytest.fixture
async def channel(target):
    ch = await open_channel(target.ctl.grpc)
    yield ch
    await ch.close()


@pytest.fixture
async def legit(target, channel):
    """The legitimate leader of r0 (on h0), one committed step in."""
    party = await target.legit(channel)
    await party.step_once()
    return party
