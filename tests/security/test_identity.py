"""Identities that cannot be borrowed: leaders must name their host, agents present the secret
they got at registration, and with mTLS a certificate acts only as the hosts it is bound to."""

from __future__ import annotations

import grpc
import httpx
import pytest

from controller.core.identity import CertBinding, hash_secret
from controller.service.server import ControllerServer
from controller.settings import ControllerSettings
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import credentials
from tests.agent.cluster import Cluster
from tests.agent.helpers import alive, wait_for
from tests.certs import Authority

from .harness import (HOST, JOB, REPLICA, SECRET, Legit, expect_refused, open_channel, picture, proof, register_request,
                      start_controller)

pytestmark = pytest.mark.slow
PRECONDITION, DENIED = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED
BOUND_S = 30


@pytest.mark.parametrize("host_id, named", [("", "named no host_id, but host h0 holds its rank 0"),
                                            ("h7", "host h7 does not hold rank 0 of replica r0")])
async def test_a_leader_must_name_the_host_holding_rank_0(target, legit, host_id, named):
    """Even with the job secret (a replica credential, as a leader without an agent shows), a
    trainer on another host (one left on a replaced host) cannot lead r0."""
    await legit.join()
    before = await picture(target.ctl.http)
    other = credentials.replica_credential(SECRET, REPLICA)
    await expect_refused(legit.stub.Quorum(legit.quorum_request(step=legit.step + 1, host_id=host_id,
                                                                credential=other), timeout=10), PRECONDITION, named)
    await expect_refused(legit.stub.ReportStep(legit.report(host_id=host_id, credential=other), timeout=10),
                         PRECONDITION, named)
    await expect_refused(legit.stub.ReportFailure(pb.ReportFailureRequest(
        job_id=JOB, replica_id=REPLICA, kind=pb.ReportFailureRequest.REPLICA_DEAD, reason="x", host_id=host_id,
        credential=other), timeout=10), PRECONDITION, named)
    assert await picture(target.ctl.http) == before  # r0 neither joined, committed nor died
    await legit.stub.ReportStep(legit.report(), timeout=10)
    legit.step += 1
    await legit.still_served(target.ctl.http)


async def test_a_stranger_with_the_published_incarnation_cannot_act_for_an_agent(tmp_path):
    """Real controller, real agents: h1 runs r0, h2 is a spare. A stranger who read h1's
    incarnation from the status API can neither take its order stream nor report for it; the
    real agent's stream stays open, as the drain that follows shows."""
    c = Cluster(tmp_path, heartbeat_timeout_s=30)
    try:
        await c.start_controller(replicas=1)
        await c.start_agent("h1", replica="r0")
        await c.start_agent("h2", spare=True)
        [trainer] = await wait_for(lambda: c.trainers("r0"), BOUND_S, "r0's trainer on h1")
        incarnation = (await c.host("h1"))["incarnation"]
        async with grpc.aio.insecure_channel(c.grpc) as channel:
            stranger = pbg.ControllerStub(channel)
            for secret, why in (("", "missing"), ("guess", "wrong")):
                await expect_refused(stranger.Orders(pb.OrdersRequest(
                    host_id="h1", incarnation=incarnation, agent_secret=secret), timeout=10).read(),
                    DENIED, f"agent secret is {why}")
            await expect_refused(stranger.ReportTrainerExit(pb.TrainerExitRequest(
                host_id="h1", replica_id="r0", rank=0, exit_code=1, gave_up=True), timeout=10), DENIED, "h1")
            await expect_refused(stranger.AckOrder(pb.AckOrderRequest(
                host_id="h1", order_id="o1", ok=False, error="lies"), timeout=10), DENIED, "h1")
        h1 = await c.host("h1")
        assert not h1["cordoned"] and h1["assignment"]["replica_id"] == "r0"
        assert not await c.events("order_failed") and not await c.events("death")
        # The real agent still holds its stream: a drain's STOP reaches it and it stops r0.
        assert (await c.post("/api/v1/hosts/h1/drain", "s3cret")).status_code == 200
        await wait_for(lambda: not alive(trainer["pid"]), BOUND_S, "h1's trainer stopped by the STOP order")
        await wait_for(lambda: [t for t in c.trainers("r0") if t["env"]["FTHSDP_HOST_ID"] == "h2"],
                       BOUND_S, "r0 moved to the spare h2")
    finally:
        await c.close()


async def test_the_agent_secret_is_never_shown_logged_or_stored(tmp_path):
    log = tmp_path / "controller.log"
    with open(log, "w") as err:
        ctl = start_controller("--log-level", "DEBUG", stderr=err)
    try:
        channel = await open_channel(ctl.grpc)
        legit = Legit(pbg.ControllerStub(channel))
        await legit.register()
        await legit.step_once()
        again = await legit.stub.RegisterAgent(register_request(), timeout=10)
        assert again.agent_secret == ""  # a repeated registration does not hand out a new one
        shown = str(await picture(ctl.http))
        assert legit.secret not in shown and hash_secret(legit.secret) not in shown
        await channel.close()
    finally:
        ctl.stop()
    assert legit.secret not in log.read_text()


async def test_the_store_keeps_only_the_secrets_hash():
    srv = ControllerServer(ControllerSettings(job_id=JOB, replicas=1, min_replicas=1))
    await srv.start()
    try:
        await srv.wait_leading(10)
        async with grpc.aio.insecure_channel(srv.grpc_address) as channel:
            legit = Legit(pbg.ControllerStub(channel))
            await legit.register()
        stored = b"".join(value for value, _ in srv.store._data.values())
        assert hash_secret(legit.secret).encode() in stored and legit.secret.encode() not in stored
    finally:
        await srv.stop()


# -- client certificates bound to host ids ------------------------------------------------------

SPIFFE = "spiffe://fthsdp.test/agent/{host_id}"


@pytest.fixture
def pki(tmp_path):
    ca = Authority(tmp_path, "fthsdp-ca")
    return {"ca": ca, "server": ca.issue("server", "controller", server=True),
            "h1": ca.issue("h1", "agent-h1", server=False, uris=("spiffe://fthsdp.test/agent/h1",)),
            "cn-h2": ca.issue("cn-h2", "h2", server=False)}


def creds(pki, who: str) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(pki["ca"].pem.cert.read_bytes(), pki[who].key.read_bytes(),
                                        pki[who].cert.read_bytes())


async def test_a_certificate_acts_only_as_the_host_it_is_bound_to(pki):
    server = pki["server"]
    ctl = start_controller("--tls-cert-file", str(server.cert), "--tls-key-file", str(server.key),
                           "--tls-client-ca-file", str(pki["ca"].pem.cert), "--bind-client-cert-to-host", SPIFFE)
    try:
        async with await open_channel(ctl.grpc, creds(pki, "h1")) as channel:
            stub = pbg.ControllerStub(channel)
            h1 = await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h1", incarnation="i1", spare=True,
                                                                      proof=proof("h1", "i1")), timeout=10)
            assert h1.agent_secret
            wants = "wants an identity 'spiffe://fthsdp.test/agent/h2'"
            await expect_refused(stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h2", incarnation="i2", spare=True,
                                                                          proof=proof("h2", "i2")),
                                                    timeout=10), DENIED, "may not act as host 'h2'", wants)

            async def beat():
                yield pb.HeartbeatRequest(host_ids=["h1", "h2"])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                _ = [r async for r in stub.Heartbeat(beat(), timeout=10)]
            assert err.value.code() == DENIED and "'h2'" in err.value.details()
            await expect_refused(stub.Quorum(pb.QuorumRequest(job_id=JOB, replica_id="r0", world_size=1, host_id="h2"),
                                             timeout=10), DENIED, "may not act as host 'h2'")
        async with await open_channel(ctl.grpc, creds(pki, "cn-h2")) as channel:  # CN h2, no SAN
            await expect_refused(pbg.ControllerStub(channel).Orders(pb.OrdersRequest(
                host_id="h1", incarnation="i1", agent_secret=h1.agent_secret), timeout=10).read(), DENIED, "'h1'")
        hosts = httpx.get(f"{ctl.http}/api/v1/hosts", timeout=10).json()
        assert [h["host_id"] for h in hosts] == ["h1"]
    finally:
        ctl.stop()


@pytest.mark.parametrize("rule, identities, host, allowed", [
    ("exact", ("h1",), "h1", True),
    ("exact", ("agent-h1", "h1.example"), "h1", False),
    ("{host_id}.agents.example", ("h1.agents.example",), "h1", True),
    ("{host_id}.agents.example", ("h1.agents.example",), "h2", False),
    (SPIFFE, ("spiffe://fthsdp.test/agent/h1",), "h1", True),
    (SPIFFE, (), "h1", False),
])
def test_binding_rules(rule, identities, host, allowed):
    assert (CertBinding(rule).validate().problem(identities, host) is None) == allowed


def test_a_bad_binding_rule_is_refused():
    with pytest.raises(ValueError, match="contains \\{host_id\\}|containing \\{host_id\\}, got 'agents'"):
        ControllerSettings(bind_client_cert_to_host="agents").validate()
