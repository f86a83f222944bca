"""gRPC with TLS and mTLS: the wrong clients are refused, the right one gets through."""

import grpc
import pytest

from controller.service.server import ControllerServer
from controller.settings import ControllerSettings
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos.dial import TlsFiles, aio_channel

from ..certs import Authority


@pytest.fixture
def pki(tmp_path):
    ca = Authority(tmp_path, "fthsdp-ca")
    rogue = Authority(tmp_path, "rogue-ca")
    return {"ca": ca, "server": ca.issue("server", "controller", server=True),
            "client": ca.issue("client", "agent-1", server=False),
            "rogue_client": rogue.issue("rogue", "agent-x", server=False)}


async def start(pki, mtls: bool) -> ControllerServer:
    server_pem = pki["server"]
    creds = grpc.ssl_server_credentials(
        [(server_pem.key.read_bytes(), server_pem.cert.read_bytes())],
        root_certificates=pki["ca"].pem.cert.read_bytes() if mtls else None, require_client_auth=mtls)
    srv = ControllerServer(ControllerSettings(replicas=1), grpc_credentials=creds)
    await srv.start()
    await srv.wait_leading(10)
    return srv


async def call(address: str, tls: TlsFiles | None):
    async with aio_channel(address, tls) as channel:
        return await pbg.ControllerStub(channel).RegisterAgent(
            pb.RegisterAgentRequest(host_id="h1", incarnation="i1", spare=True), timeout=5)


async def test_tls_refuses_plaintext_and_accepts_the_right_ca(pki):
    srv = await start(pki, mtls=False)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(srv.grpc_address, None)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError):
            await call(srv.grpc_address, TlsFiles(ca_file=str(pki["rogue_client"].cert)))  # wrong trust anchor
        reply = await call(srv.grpc_address, TlsFiles(ca_file=str(pki["ca"].pem.cert)))
        assert "spare pool" in reply.reason
        assert set(srv.state.hosts) == {"h1"}
    finally:
        await srv.stop()


async def test_mtls_refuses_missing_and_wrong_client_certificates(pki):
    srv = await start(pki, mtls=True)
    ca = str(pki["ca"].pem.cert)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(srv.grpc_address, TlsFiles(ca_file=ca))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        rogue = pki["rogue_client"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(srv.grpc_address, TlsFiles(ca_file=ca, cert_file=str(rogue.cert), key_file=str(rogue.key)))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert srv.state.hosts == {}  # nothing got in
        good = pki["client"]
        reply = await call(srv.grpc_address, TlsFiles(ca_file=ca, cert_file=str(good.cert), key_file=str(good.key)))
        assert "spare pool" in reply.reason
    finally:
        await srv.stop()


def test_tls_files_validation(tmp_path):
    with pytest.raises(ValueError, match="needs both a cert and a key file"):
        TlsFiles(ca_file=None, cert_file="x").validate()
    with pytest.raises(ValueError, match=f"TLS file {tmp_path}/missing.pem does not exist"):
        TlsFiles(ca_file=str(tmp_path / "missing.pem")).validate()
