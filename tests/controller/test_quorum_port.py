"""The quorum port: the leaders' joins framed on TCP (or TLS), next to QuorumStream.

A real controller in-process, the runtime's real port client (blocking, so in a thread), raw
sockets for the strangers: the same round and answer bytes as the stream, and every bad
connection refused with a code and a message naming what was wrong, the round unchanged."""

import asyncio
import socket
import ssl

import grpc
import httpx
import pytest

from controller.service.quorum_port import peer_certificate_facts
from controller.service.server import ControllerServer
from controller.settings import ControllerSettings
from fthsdp.step.quorum_port_client import QuorumPortClient, resolve
from fthsdp.step.quorum_stream import StreamFailed
from protos import controller_pb2 as pb
from protos.dial import TlsFiles
from protos.quorum_wire import ANSWER, HEADER, JOIN, PREAMBLE, REFUSED, FrameReader, frame

from ..certs import Authority
from .conftest import quorum_request, samples, wait_for
from .test_quorum_stream import Leader

WAIT_S = 10


class PortLeader:
    """A replica leader on the quorum port, with the runtime's own client."""

    def __init__(self, address: str, rid: str, tls: TlsFiles | None = None) -> None:
        self.address, self.rid, self.known = resolve(address, "127.0.0.1:0"), rid, 0
        self.client = QuorumPortClient(tls)

    async def ask(self, step: int, **kw) -> pb.QuorumResponse:
        request = quorum_request(self.rid, step, known_quorum_id=self.known, **kw)
        reply = await asyncio.to_thread(self.client.ask, self.address, request, WAIT_S)
        self.known = reply.quorum_id
        return reply


def raw_exchange(address: str, data: bytes, *, read: bool = True) -> tuple[int, bytes] | None:
    """Send `data` on a fresh connection; the one frame the controller sends back (None: it
    closed without one), and check it closed the connection after it."""
    host, port = resolve(address, "127.0.0.1:0").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(data)
        reader, frames = FrameReader(1 << 20, frozenset({ANSWER, REFUSED}), preamble=False), []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            frames += reader.feed(chunk)
            if not read:
                break
        assert len(frames) <= 1, frames
        return frames[0] if frames else None


async def scrape(server) -> dict:
    async with httpx.AsyncClient() as http:
        return samples((await http.get(f"{server.http_url}/metrics", timeout=WAIT_S)).text)


def refusal(reply) -> pb.QuorumPortRefusal:
    assert reply is not None and reply[0] == REFUSED, reply
    return pb.QuorumPortRefusal.FromString(reply[1])


async def test_a_round_on_the_port_is_the_streams_round_with_the_same_bytes(server, stub):
    assert server.quorum_address == f":{server.quorum._listener.sockets[0].getsockname()[1]}"
    on_port = [PortLeader(server.quorum_address, rid) for rid in ("r0", "r1")]
    on_stream = Leader(stub, "r2")
    answers = await asyncio.gather(*(p.ask(0) for p in on_port), on_stream.ask(0))
    assert {a.SerializeToString() for a in answers} == {server.answers.encoded(0)}
    assert answers[0].quorum_address == server.quorum_address and answers[0].addresses_included
    qid = answers[0].quorum_id
    for step in (1, 2):
        again = await asyncio.gather(*(p.ask(step) for p in on_port), on_stream.ask(step))
        assert {a.quorum_id for a in again} == {qid} and {a.max_step for a in again} == {step}
        assert not any(a.addresses_included for a in again)  # they hold this quorum id
    assert all(p.client.open for p in on_port)  # one connection per leader, kept
    seen = await scrape(server)
    assert seen[("fthsdp_quorum_port_answers_total", ())] == 6 and seen[("fthsdp_quorum_port_connections", ())] == 2
    for p in on_port:
        p.client.close()


async def test_a_refused_join_has_the_streams_code_and_leaves_the_round_alone(server):
    leader = PortLeader(server.quorum_address, "r0")
    with pytest.raises(StreamFailed) as err:
        await asyncio.to_thread(leader.client.ask, leader.address,
                                pb.QuorumRequest(job_id="other", replica_id="r0", step=0, world_size=2), WAIT_S)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "'other'" in err.value.details()
    with pytest.raises(StreamFailed) as err:
        await asyncio.to_thread(leader.client.ask, leader.address, quorum_request("r0", 0, world=0), WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "world_size" in err.value.details()
    assert not leader.client.open and server.state.round_joined == {}


@pytest.mark.parametrize("data, named", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "did not start with the quorum port's preamble"),
    (PREAMBLE + HEADER.pack((8 << 20) + 1, JOIN), f"a frame of {(8 << 20) + 1} bytes is over the limit of {8 << 20}"),
    (PREAMBLE + HEADER.pack(3, 9) + b"abc", "frame kind 9 is not one of [1, 3]"),
    (PREAMBLE + frame(JOIN, b"\xff\xff\xff"), "a join of 3 bytes is not a QuorumRequest"),
])
async def test_strangers_bytes_are_refused_with_what_was_wrong(server, data, named):
    reply = await asyncio.to_thread(raw_exchange, server.quorum_address, data)
    r = refusal(reply)
    assert r.code == "INVALID_ARGUMENT" and named in r.details, r.details
    assert server.state.round_joined == {}
    assert server.quorum.connections == set()


async def test_a_second_join_before_the_answer_is_refused_and_the_first_leaves_the_round(server):
    join = frame(JOIN, quorum_request("r0", 0).SerializeToString())
    reply = await asyncio.to_thread(raw_exchange, server.quorum_address, PREAMBLE + join + join)
    r = refusal(reply)
    assert r.code == "FAILED_PRECONDITION" and "a message arrived before the answer to the last one" in r.details
    await wait_for(lambda: "r0" not in server.state.round_joined, WAIT_S, "r0's join to leave the round")


async def test_one_connection_carries_one_replica(server):
    host, port = resolve(server.quorum_address, "127.0.0.1:0").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    frames = FrameReader(1 << 20, frozenset({ANSWER, REFUSED}), preamble=False)

    async def one_frame():
        while True:
            got = frames.feed(await asyncio.wait_for(reader.read(65536), WAIT_S))
            if got:
                [one] = got
                return one

    writer.write(PREAMBLE + frame(JOIN, quorum_request("r0", 0).SerializeToString()))
    others = [PortLeader(server.quorum_address, rid) for rid in ("r1", "r2")]
    _, kind_payload = await asyncio.gather(asyncio.gather(*(p.ask(0) for p in others)), one_frame())
    assert kind_payload[0] == ANSWER
    writer.write(frame(JOIN, quorum_request("r1", 1).SerializeToString()))
    r = refusal(await one_frame())
    assert r.code == "FAILED_PRECONDITION" and "carries replica 'r0'; a join for 'r1'" in r.details
    assert server.state.round_joined == {}  # the stray join joined nobody
    writer.close()


async def test_a_leader_that_hangs_up_while_waiting_leaves_the_round(server):
    host, port = resolve(server.quorum_address, "127.0.0.1:0").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(PREAMBLE + frame(JOIN, quorum_request("r0", 0).SerializeToString()))
    await wait_for(lambda: "r0" in server.state.round_joined, WAIT_S, "r0 to join")
    writer.close()
    await wait_for(lambda: "r0" not in server.state.round_joined, WAIT_S, "r0 to leave the round")
    assert "r0" not in server.waiters


@pytest.fixture
async def impatient(clock):
    srv = ControllerServer(ControllerSettings(job_id="t", replicas=3, min_replicas=2, quorum_port_hello_s=0.3),
                           clock=clock)
    await srv.start()
    await srv.wait_leading(10)
    yield srv
    await srv.stop()


async def test_a_silent_connection_is_cut_off(impatient):
    reply = await asyncio.to_thread(raw_exchange, impatient.quorum_address, PREAMBLE)
    r = refusal(reply)
    assert r.code == "DEADLINE_EXCEEDED" and "no join within 0.3s" in r.details
    seen = await scrape(impatient)
    assert {k[1]: v for k, v in seen.items() if k[0] == "fthsdp_quorum_port_refusals_total"} == {
        (("code", "DEADLINE_EXCEEDED"),): 1}
    assert seen[("fthsdp_quorum_port_connections", ())] == 0


async def test_a_full_port_refuses_more_connections(clock):
    srv = ControllerServer(ControllerSettings(job_id="t", replicas=3, min_replicas=2, quorum_port_hello_s=120),
                           clock=clock)
    await srv.start()
    held = []
    try:
        limit = srv.quorum.max_connections
        assert limit == 2 * srv.settings.max_replica_records
        host, port = resolve(srv.quorum_address, "127.0.0.1:0").rsplit(":", 1)
        held = [await asyncio.open_connection(host, int(port)) for _ in range(limit)]
        await wait_for(lambda: len(srv.quorum.connections) == limit, WAIT_S, "the port to hold its limit")
        over = refusal(await asyncio.to_thread(raw_exchange, srv.quorum_address, b""))
        assert over.code == "RESOURCE_EXHAUSTED" and f"holds {limit} connections" in over.details
        seen = await scrape(srv)
        assert seen[("fthsdp_quorum_port_connections", ())] == limit
        assert seen[("fthsdp_quorum_port_refusals_total", (("code", "RESOURCE_EXHAUSTED"),))] == 1
        for _, writer in held:
            writer.close()
        await wait_for(lambda: not srv.quorum.connections, WAIT_S, "the held connections to close")
    finally:
        for _, writer in held:
            writer.close()
        await srv.stop()


async def test_a_standby_refuses_with_the_leaders_address(server):
    server.step_down("test: a standby took over")
    server.leader_address = "10.9.9.9:50051"
    leader = PortLeader(server.quorum_address, "r0")
    with pytest.raises(StreamFailed) as err:
        await leader.ask(0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "standby" in err.value.details()
    assert dict(err.value.trailing_metadata()) == {"fthsdp-leader": "10.9.9.9:50051"}


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path):
    ca = Authority(tmp_path, "fthsdp-ca")
    return {"ca": ca, "server": ca.issue("server", "controller", server=True),
            "h1": ca.issue("h1", "h1", server=False), "h2": ca.issue("h2", "h2", server=False)}


def server_context(pki) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pki["server"].cert), str(pki["server"].key))
    context.load_verify_locations(str(pki["ca"].pem.cert))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def test_with_mtls_the_port_needs_a_client_certificate_bound_to_the_host(pki):
    ca = pki["ca"].pem.cert.read_bytes()
    creds = grpc.ssl_server_credentials([(pki["server"].key.read_bytes(), pki["server"].cert.read_bytes())],
                                        root_certificates=ca, require_client_auth=True)
    settings = ControllerSettings(job_id="t", replicas=1, bind_client_cert_to_host="exact")
    plain = ControllerServer(settings, grpc_credentials=creds)  # TLS gRPC, no SSL context: no port at all
    srv = ControllerServer(settings, grpc_credentials=creds, quorum_tls=server_context(pki))
    for s in (plain, srv):
        await s.start()
    try:
        assert plain.quorum_address == "" and plain.quorum is None
        await srv.wait_leading(10)
        ca_only = TlsFiles(ca_file=str(pki["ca"].pem.cert))
        as_h1 = TlsFiles(ca_file=str(pki["ca"].pem.cert), cert_file=str(pki["h1"].cert), key_file=str(pki["h1"].key))
        join = quorum_request("r0", 0, host_id="h2")
        for tls in (None, ca_only):  # plain TCP to a TLS port; TLS without a client certificate
            with pytest.raises(StreamFailed) as err:
                await asyncio.to_thread(QuorumPortClient(tls).ask, resolve(srv.quorum_address, "127.0.0.1:0"), join, WAIT_S)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(StreamFailed) as err:  # h1's certificate acting as h2
            await asyncio.to_thread(QuorumPortClient(as_h1).ask, resolve(srv.quorum_address, "127.0.0.1:0"), join, WAIT_S)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "h2" in err.value.details()
        assert srv.state.round_joined == {}
        answer = await asyncio.to_thread(QuorumPortClient(as_h1).ask, resolve(srv.quorum_address, "127.0.0.1:0"),
                                         quorum_request("r0", 0), WAIT_S)
        assert [m.replica_id for m in answer.members] == ["r0"]
    finally:
        for s in (plain, srv):
            await s.stop()


def test_certificate_facts_read_like_grpcs_auth_context():
    peercert = {"subject": ((("organizationName", "x"),), (("commonName", "h1"),)),
                "subjectAltName": (("DNS", "h1.agents"), ("URI", "spiffe://e/agent/h1"), ("IP Address", "10.0.0.1"))}
    assert peer_certificate_facts(peercert) == {
        "peer_dns": [b"h1.agents"], "peer_uri": [b"spiffe://e/agent/h1"], "x509_common_name": [b"h1"]}
    assert peer_certificate_facts(None) == {}


async def test_the_port_is_named_at_the_advertised_host_or_at_the_host_leaders_reach_grpc_at(settings):
    srv = ControllerServer(settings, advertise_address="ctl.example:50051")
    await srv.start()
    try:
        bound = srv.quorum._listener.sockets[0].getsockname()[1]
        assert srv.quorum_address == f"ctl.example:{bound}"
    finally:
        await srv.stop()
    assert resolve(":50052", "fthsdp-controller-grpc:50051") == "fthsdp-controller-grpc:50052"
    assert resolve(":50052", "[::1]:50051") == "[::1]:50052"
    assert resolve("10.0.0.5:7000", "ctl:50051") == "10.0.0.5:7000"


async def test_a_commit_report_on_the_port_commits_once_the_store_holds_it(server, stub):
    leaders = [PortLeader(server.quorum_address, rid) for rid in ("r0", "r1")]
    answers = await asyncio.gather(*(p.ask(0) for p in leaders), Leader(stub, "r2").ask(0))
    qid = answers[0].quorum_id
    reporter = QuorumPortClient()  # a leader's second connection: reports come from another thread
    report = pb.ReportStepRequest(job_id="t", replica_id="r0", quorum_id=qid, step=0, step_time_s=0.5)
    answer = await asyncio.to_thread(reporter.report, leaders[0].address, report, WAIT_S)
    assert answer == pb.ReportStepResponse() and server.state.replicas["r0"].committed_step == 0
    assert server.quorum.reports == 1 and (await scrape(server))[("fthsdp_quorum_port_reports_total", ())] == 1
    with pytest.raises(StreamFailed) as err:  # a commit of a step it was not given: the state refuses it
        await asyncio.to_thread(reporter.report, leaders[0].address,
                                pb.ReportStepRequest(job_id="t", replica_id="r0", quorum_id=qid, step=5), WAIT_S)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "step 5" in err.value.details()
    assert server.state.replicas["r0"].committed_step == 0 and not reporter.open
    for p in leaders:
        p.client.close()
