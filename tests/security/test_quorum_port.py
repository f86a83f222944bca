"""The quorum port of a real controller process under attack: strangers' bytes, frames as large
as the bound allows, refused joins, and every connection slot held by silent strangers. Each
is refused with its reason and kept by nobody; the real leader, with the runtime's own client,
goes on committing (on the stream while the port is full)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from fthsdp.step import coordination as co
from fthsdp.step.controller_client import ControllerClient
from fthsdp.step.quorum_port_client import resolve
from protos import controller_pb2 as pb
from protos.credentials import ENV_TRAINER_TOKEN, replica_credential, trainer_token
from protos.quorum_wire import ANSWER, HEADER, JOIN, PREAMBLE, REFUSED, FrameReader, frame

from .harness import HOST, JOB, LEADER_CREDENTIAL, REPLICA, SECRET, picture, rss

pytestmark = pytest.mark.slow
WAIT_S = 10
#: Under the 8 MiB request bound: read whole, then refused as no QuorumRequest.
BIG = 7 << 20


def exchange(address: str, data: bytes) -> pb.QuorumPortRefusal:
    """Send `data` on a fresh connection: the controller must answer with a refusal and close."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(data)
        reader, frames = FrameReader(1 << 20, frozenset({ANSWER, REFUSED}), preamble=False), []
        while chunk := sock.recv(65536):
            frames += reader.feed(chunk)
    assert [kind for kind, _ in frames] == [REFUSED], frames
    return pb.QuorumPortRefusal.FromString(frames[0][1])


def join(**kw) -> bytes:
    fields = dict(job_id=JOB, replica_id=REPLICA, step=0, world_size=1, host_id=HOST, credential=LEADER_CREDENTIAL)
    return PREAMBLE + frame(JOIN, pb.QuorumRequest(**{**fields, **kw}).SerializeToString())


#: (what is sent, the refusal's code, what its message names)
VOLLEY = [
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64), "INVALID_ARGUMENT", "preamble"),  # a TLS hello
    (PREAMBLE + HEADER.pack(0xFFFFFFFF, JOIN), "INVALID_ARGUMENT", f"a frame of {0xFFFFFFFF} bytes is over"),
    (PREAMBLE + frame(JOIN, b"\x0a" + b"\xff" * BIG), "INVALID_ARGUMENT", "is not a QuorumRequest"),
    (join(job_id="someone-else"), "FAILED_PRECONDITION", "'someone-else'"),
    (join(credential=""), "PERMISSION_DENIED", "it shows no credential"),
    (join(credential="host:" + "0" * 64), "PERMISSION_DENIED", "not the trainer token of host 'h0'"),
    # with the job secret (a leader without an agent), but on the wrong host: fenced all the same
    (join(host_id="h9", credential=replica_credential(SECRET, REPLICA)), "FAILED_PRECONDITION",
     "host h9 does not hold rank 0"),
    (join(replica_id="r" * (2 << 20)), "INVALID_ARGUMENT", "replica_id"),
    (join(world_size=1 << 30), "INVALID_ARGUMENT", "world_size"),
]


def leader_step(client: ControllerClient, step: int, known: int) -> pb.QuorumResponse:
    return client.quorum(co.RequestQuorum(step, known, ("127.0.0.1:7001",), ("127.0.0.1:7002",)), 1, "",
                         timeout_s=20)


async def test_strangers_on_the_quorum_port_are_refused_and_the_leader_keeps_committing(target, legit,
                                                                                          monkeypatch):
    assert target.ctl.quorum.startswith(":")
    port = resolve(target.ctl.quorum, target.ctl.grpc)
    await legit.resume(target.ctl.http)
    before = await picture(target.ctl.http)
    samples = [rss(target.ctl)]
    for _ in range(3):
        for data, code, named in VOLLEY:
            refusal = await asyncio.to_thread(exchange, port, data)
            assert refusal.code == code and named in refusal.details, (code, refusal.details[:300])
            assert len(refusal.details) < 2000
        samples.append(rss(target.ctl))
    assert await picture(target.ctl.http) == before  # nobody joined, committed or died
    # Volleys of 3 × 7 MiB frames: what stays is bounded (the allocator keeps some for a while).
    assert min(samples[-2:]) - samples[1] < 40 and max(samples) - samples[0] < 128, samples

    # Every slot taken by a silent stranger (renewed as the hello deadline cuts them off): the
    # real leader's port ask is refused as full, and it commits on the stream instead.
    monkeypatch.setenv("FTHSDP_HOST_ID", HOST)
    monkeypatch.setenv(ENV_TRAINER_TOKEN, trainer_token(SECRET, HOST))  # as h0's agent hands it
    client = ControllerClient(target.ctl.grpc, JOB, REPLICA, "lead-2")
    host, number = port.rsplit(":", 1)
    held = []
    try:
        answer = await asyncio.to_thread(leader_step, client, legit.step, legit.quorum_id)
        await legit.stub.ReportStep(legit.report(quorum_id=answer.quorum_id, step=answer.max_step), timeout=10)
        assert client._port_address == port
        for _ in range(60):  # more than the limit (2 × max_replica_records = 2 × (4 × 1 + 16))
            reader, writer = await asyncio.open_connection(host, int(number))
            writer.write(PREAMBLE)
            held.append((reader, writer))
        over = await asyncio.wait_for(held[-1][0].read(65536), WAIT_S)
        [(kind, payload)] = FrameReader(1 << 20, frozenset({REFUSED}), preamble=False).feed(over)
        assert "RESOURCE_EXHAUSTED" == pb.QuorumPortRefusal.FromString(payload).code
        again = await asyncio.to_thread(leader_step, client, answer.max_step + 1, answer.quorum_id)
        assert again.max_step == answer.max_step + 1 and client._port_address == ""  # served on the stream
        assert port in client._port_failed_at
    finally:
        for _, writer in held:
            writer.close()
        await asyncio.to_thread(client.close)
