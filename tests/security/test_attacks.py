"""The attacks of issue 23, each by a stranger with network reach and the public REST view,
against a real controller process: refused with a reason, state unchanged, the legitimate
parties unaffected -- and the same attack succeeding against a controller started with
--insecure (so each test could fail).

The legitimate parties: h0's agent (r0's only rank) and r0's leader on h0, holding what the
real ones hold (harness.Legit), and in some tests a spare h1 whose agent beats."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fthsdp.step.quorum_port_client import QuorumPortClient, resolve
from fthsdp.step.quorum_stream import StreamFailed
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import credentials, job_secret
from protos.quorum_wire import ANSWER, HEADER, JOIN, PREAMBLE, REFUSED, FrameReader, frame

from .harness import (HOST, JOB, LEADER_CREDENTIAL, REPLICA, SECRET, Legit, beat_forever, expect_refused, open_channel,
                      picture, proof, rss, start_controller)

pytestmark = pytest.mark.slow
DENIED = grpc.StatusCode.PERMISSION_DENIED
TIMEOUT_S = 2.0  # the heartbeat timeout of these controllers
BOUND_S = 20
MODES = ("secure", "insecure")


@contextlib.asynccontextmanager
async def job(mode: str, *flags: str, h0_beats: bool = True):
    """A controller (holding the job secret, or --insecure), h0's agent and r0's leader one
    step in, beating as the real ones do (unless not `h0_beats`), and a stranger's stub on its
    own channel."""
    ctl = start_controller("--heartbeat-timeout-s", str(TIMEOUT_S), *flags, insecure=mode == "insecure")
    channel, stranger_channel = await open_channel(ctl.grpc), await open_channel(ctl.grpc)
    beating: list[asyncio.Task] = []
    try:
        legit = Legit(pbg.ControllerStub(channel))
        await legit.register()
        await legit.step_once()
        if h0_beats:
            beating.append(asyncio.ensure_future(beat_forever(legit.stub, HOST, legit.secret, REPLICA,
                                                              LEADER_CREDENTIAL)))
        yield ctl, legit, pbg.ControllerStub(stranger_channel), beating
    finally:
        for task in beating:
            task.cancel()
        await asyncio.gather(*beating, return_exceptions=True)
        await channel.close()
        await stranger_channel.close()
        ctl.stop()


async def register(stub, host_id: str, incarnation: str, secret=SECRET, made_at: float | None = None,
                   **kw) -> pb.RegisterAgentResponse:
    made = proof(host_id, incarnation, secret) if made_at is None else credentials.registration_proof(
        secret, host_id, incarnation, made_at)
    return await stub.RegisterAgent(pb.RegisterAgentRequest(host_id=host_id, incarnation=incarnation, proof=made,
                                                            **kw), timeout=10)


async def hosts(ctl) -> dict:
    async with httpx.AsyncClient(base_url=ctl.http, timeout=10) as http:
        return {h["host_id"]: h for h in (await http.get("/api/v1/hosts")).json()}


async def replicas(ctl) -> dict:
    async with httpx.AsyncClient(base_url=ctl.http, timeout=10) as http:
        return {r["replica_id"]: r for r in (await http.get("/api/v1/replicas")).json()}


async def port_refusals(ctl) -> dict[str, float]:
    """The quorum port's refusals by code, as the controller counts them (/metrics)."""
    async with httpx.AsyncClient(base_url=ctl.http, timeout=10) as http:
        text = (await http.get("/metrics")).text
    return {s.labels["code"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "fthsdp_quorum_port_refusals_total"}


async def job_state(ctl) -> str:
    async with httpx.AsyncClient(base_url=ctl.http, timeout=10) as http:
        return (await http.get("/api/v1/job")).json()["job_state"]


async def stranger_beats(stub, **ids) -> pb.HeartbeatResponse:
    async def beats():
        yield pb.HeartbeatRequest(**ids)
    [reply] = [r async for r in stub.Heartbeat(beats(), timeout=10)]
    return reply


# -- 1. keeping a dead host alive --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_1_a_stranger_cannot_keep_a_dead_host_alive(mode):
    async with job(mode, h0_beats=False) as (ctl, legit, stranger, beating):
        h1 = await register(legit.stub, "h1", "h1-1", spare=True)
        beating.append(asyncio.ensure_future(beat_forever(legit.stub, "h1", h1.agent_secret)))
        incarnation = (await hosts(ctl))[HOST]["incarnation"]  # public
        # h0's agent is gone (it beats no more); the stranger beats for it, and for r0, and
        # registers it again with the public incarnation, for three heartbeat timeouts.
        until = time.monotonic() + 3 * TIMEOUT_S
        refusals = set()
        while time.monotonic() < until:
            for attempt in (stranger_beats(stranger, host_ids=[HOST]), stranger_beats(stranger, replica_ids=[REPLICA]),
                            stranger.RegisterAgent(pb.RegisterAgentRequest(host_id=HOST, incarnation=incarnation,
                                                                          slots=1), timeout=10)):
                try:
                    await attempt
                except grpc.aio.AioRpcError as exc:
                    refusals.add((exc.code(), exc.details().split(":")[0][:40]))
            if mode == "secure" and (await hosts(ctl))[HOST]["state"] == "DEAD":
                break
            await asyncio.sleep(0.2)  # the attacker's pace
        if mode == "insecure":
            assert not refusals
            assert (await hosts(ctl))[HOST]["state"] == "ACTIVE"  # kept alive by a stranger
            assert (await hosts(ctl))["h1"]["spare"]
            return
        assert {code for code, _ in refusals} == {DENIED}, refusals
        # h0 died of silence and r0 moved to the spare, as it should.
        await wait_for_hosts(ctl, lambda hs: hs[HOST]["state"] == "DEAD" and
                             (hs["h1"]["assignment"] or {}).get("replica_id") == REPLICA, "r0 to move to h1")


async def wait_for_hosts(ctl, predicate, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not predicate(await hosts(ctl)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


# -- 2. killing or finishing a replica ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("report", ("dead", "finished"))
async def test_2_a_stranger_cannot_kill_or_finish_a_replica(mode, report):
    async with job(mode) as (ctl, legit, stranger, _):
        before = await picture(ctl.http)
        if report == "dead":
            call = stranger.ReportFailure(pb.ReportFailureRequest(
                job_id=JOB, replica_id=REPLICA, kind=pb.ReportFailureRequest.REPLICA_DEAD, reason="lies",
                host_id=HOST), timeout=10)
        else:
            call = stranger.ReportFinished(pb.ReportFinishedRequest(
                job_id=JOB, replica_id=REPLICA, step=legit.step - 1, host_id=HOST, reason="lies"), timeout=10)
        if mode == "insecure":
            await call
            assert (await replicas(ctl))[REPLICA]["state"] == ("DEAD" if report == "dead" else "FINISHED")
            if report == "finished":
                assert await job_state(ctl) == "COMPLETED"  # final: every agent stops
            return
        await expect_refused(call, DENIED, "it shows no credential")
        # A credential of another kind or for another host is no better.
        await expect_refused(stranger.ReportFailure(pb.ReportFailureRequest(
            job_id=JOB, replica_id=REPLICA, kind=pb.ReportFailureRequest.REPLICA_DEAD, reason="lies", host_id=HOST,
            credential=credentials.host_credential(credentials.trainer_token(job_secret.parse(
                job_secret.generate(), "a guess"), HOST))), timeout=10), DENIED, "not the trainer token of host 'h0'")
        assert await picture(ctl.http) == before
        await legit.still_served(ctl.http)


# -- 3. taking a replica's place on the quorum port ---------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_3_a_stranger_cannot_take_a_replicas_place_on_the_quorum_port(mode):
    async with job(mode) as (ctl, legit, stranger, _):
        before = await picture(ctl.http)
        port = resolve(ctl.quorum, ctl.grpc)
        client = QuorumPortClient()
        takeover = pb.QuorumRequest(job_id=JOB, replica_id=REPLICA, step=0, world_size=1, host_id=HOST,
                                    incarnation="the-strangers", ftar_addresses=["10.9.9.9:1"],
                                    state_addresses=["10.9.9.9:2"])
        try:
            if mode == "insecure":
                answer = await asyncio.to_thread(client.ask, port, takeover, 10)
                assert [m.replica_id for m in answer.members] == [REPLICA]
                reps = await replicas(ctl)
                assert reps[REPLICA]["incarnation"] == "the-strangers"  # the real r0 is restarted
                return
            with pytest.raises(StreamFailed) as refused:
                await asyncio.to_thread(client.ask, port, takeover, 10)
            assert refused.value.code() == DENIED and "it shows no credential" in refused.value.details()
        finally:
            client.close()
        assert await picture(ctl.http) == before
        await legit.still_served(ctl.http)


# -- 4. poisoning the weights: a newcomer far ahead --------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_4_a_stranger_cannot_join_far_ahead_and_become_the_catch_up_source(mode):
    """Refused twice over: a stranger proves nothing, and a step beyond the job's history is
    refused even to a holder of the job secret (controller/core/admission.py)."""
    async with job(mode, "--replicas", "5") as (ctl, legit, stranger, _):  # r1..r4 configured, not running
        before = await picture(ctl.http)
        ahead = stranger.Quorum(pb.QuorumRequest(job_id=JOB, replica_id="r4", step=10**9, world_size=1,
                                                 incarnation="z", ftar_addresses=["10.9.9.9:1"],
                                                 state_addresses=["10.9.9.9:2"]), timeout=10)
        if mode == "insecure":
            # The step's plausibility holds without identities too: no quorum handed out 10^9...
            await expect_refused(ahead, grpc.StatusCode.FAILED_PRECONDITION, "beyond the job's history")
            # ...but a stranger joins as a new replica with no proof at all.
            pending = asyncio.ensure_future(stranger.Quorum(pb.QuorumRequest(
                job_id=JOB, replica_id="r4", step=legit.step, world_size=1, incarnation="z"), timeout=10))
            deadline = time.monotonic() + BOUND_S
            while "r4" not in await replicas(ctl):
                assert time.monotonic() < deadline, "r4 never joined"
                await asyncio.sleep(0.02)
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
            return
        await expect_refused(ahead, DENIED, "it shows no credential")
        # Not even with the job secret (a leader without an agent, new to the job): a step far
        # beyond the history is no step any quorum handed out.
        await expect_refused(stranger.Quorum(pb.QuorumRequest(
            job_id=JOB, replica_id="r4", step=10**9, world_size=1, incarnation="z", ftar_addresses=["10.9.9.9:1"],
            state_addresses=["10.9.9.9:2"], credential=credentials.replica_credential(SECRET, "r4")), timeout=10),
            grpc.StatusCode.FAILED_PRECONDITION, "beyond the job's history", f"at most step {legit.step}")
        assert await picture(ctl.http) == before
        await legit.still_served(ctl.http)


# -- 5. stalling the job with phantom replicas ---------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_5_phantom_replicas_cannot_stall_the_job(mode):
    async with job(mode, "--replicas", "5") as (ctl, legit, stranger, _):  # r1..r4 configured, not running
        before = await picture(ctl.http)
        phantoms = [f"r{i}" for i in range(1, 5)]
        joins = [asyncio.ensure_future(stranger.Quorum(pb.QuorumRequest(
            job_id=JOB, replica_id=p, step=0, world_size=1, incarnation=p), timeout=10)) for p in phantoms]
        if mode == "insecure":
            seen = await replicas(ctl)
            deadline = time.monotonic() + BOUND_S
            while not set(phantoms) <= set(seen):
                assert time.monotonic() < deadline, seen
                await asyncio.sleep(0.05)
                seen = await replicas(ctl)
            await stranger_beats(stranger, replica_ids=phantoms)  # kept alive by the stranger's beats
            await asyncio.gather(*joins, return_exceptions=True)
            return
        for j in joins:
            await expect_refused(j, DENIED, "it shows no credential")
        await expect_refused(stranger_beats(stranger, replica_ids=[REPLICA]), DENIED, "it shows no credential")
        assert await picture(ctl.http) == before
        await legit.still_served(ctl.http)


# -- 6. claiming a dead or unknown host id --------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_6_a_stranger_cannot_claim_a_dead_or_unknown_host(mode):
    async with job(mode) as (ctl, legit, stranger, _):
        await register(legit.stub, "h1", "h1-1", spare=True)  # and its agent dies: no beats
        await wait_for_hosts(ctl, lambda hs: hs["h1"]["state"] == "DEAD", "h1 to be declared dead")
        attempts = {
            "no proof": dict(proof=""),
            "a proof under another secret": dict(proof=proof("h1", "mine", job_secret.parse(job_secret.generate(),
                                                                                             "a guess"))),
            "a stale proof": dict(proof=credentials.registration_proof(SECRET, "h1", "mine", time.time() - 3600)),
            "another host's proof": dict(proof=proof("h0", "mine")),
        }
        if mode == "insecure":
            reply = await stranger.RegisterAgent(pb.RegisterAgentRequest(host_id="h1", incarnation="mine",
                                                                         spare=True), timeout=10)
            assert reply.agent_secret and (await hosts(ctl))["h1"]["state"] == "SPARE"
            return
        before = await picture(ctl.http)
        for host_id in ("h1", "h9"):
            for why, fields in attempts.items():
                await expect_refused(stranger.RegisterAgent(pb.RegisterAgentRequest(
                    host_id=host_id, incarnation="mine", spare=True, **fields), timeout=10), DENIED,
                    f"the registration of host '{host_id}' is refused")
        assert await picture(ctl.http) == before  # h1 still DEAD, no h9, no secret handed out
        # The real agent, with the job secret, takes its host back.
        back = await register(legit.stub, "h1", "h1-2", spare=True)
        assert back.agent_secret and (await hosts(ctl))["h1"]["state"] == "SPARE"
        await legit.still_served(ctl.http)


def test_the_controller_refuses_to_start_without_a_job_secret():
    """No secret, no --insecure: it says why and exits 2."""
    env = {k: v for k, v in os.environ.items() if k not in (job_secret.ENV_JOB_SECRET, job_secret.ENV_JOB_SECRET_FILE)}
    done = subprocess.run([sys.executable, "-m", "controller.main", "--grpc-port", "0", "--http-port", "0"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no job secret" in done.stderr and "--job-secret-file" in done.stderr and "--insecure" in done.stderr


# -- 8a. exhausting the quorum port's memory ------------------------------------------------------------

SLOW_FRAME = 7 << 20  # a frame this long is announced...
SENT = 6 << 20        # ...and this much of it sent, then nothing


def _strangers(port: str, count: int, joined: bytes = b"") -> list:
    """`count` connections that each send `joined` (a whole join, or nothing), then begin a
    7 MiB frame, send 6 MiB of it and stop."""
    host, number = port.rsplit(":", 1)
    out = []
    for _ in range(count):
        sock = socket.create_connection((host, int(number)), timeout=BOUND_S)
        sock.sendall(PREAMBLE + joined)
        if joined:  # the join's answer first
            reader = FrameReader(1 << 20, frozenset({ANSWER, REFUSED}), preamble=False)
            while not (got := reader.feed(sock.recv(65536))):
                pass
            assert [k for k, _ in got] == [ANSWER], got
        try:
            sock.sendall(HEADER.pack(SLOW_FRAME, JOIN) + b"\x0a" * SENT)
        except OSError:
            pass  # refused (and closed) before all of it was sent
        out.append(sock)
    return out


def _refusal(sock) -> str:
    """The code of the refusal the port sent this connection before it closed it; "reset" when
    it closed it with our unread bytes (the kernel resets it), "open" when it is still open."""
    sock.settimeout(BOUND_S)
    reader, frames = FrameReader(1 << 20, frozenset({ANSWER, REFUSED}), preamble=False), []
    try:
        while chunk := sock.recv(65536):
            frames += reader.feed(chunk)
    except TimeoutError:
        return "open"
    except OSError:
        return "reset"
    return pb.QuorumPortRefusal.FromString(frames[-1][1]).code if frames else "closed"


@pytest.mark.parametrize("mode", ("bounded", "unbounded"))
async def test_8a_slow_frames_cannot_exhaust_the_quorum_ports_memory(mode, tmp_path):
    """Twenty strangers each begin a 7 MiB frame, send 6 MiB and stop; one leader that joined
    does the same after its join. With the bounds (16 MiB over all connections, 1 s per frame)
    the controller holds at most the bound and cuts them off; with bounds as loose as the job's
    size allowed before (`unbounded`), it holds all of it."""
    settings = tmp_path / "settings.json"
    loose = mode == "unbounded"
    settings.write_text(json.dumps({"quorum_port_buffer_bytes": (1 << 30) if loose else 16 << 20,
                                    "quorum_port_frame_s": 60.0 if loose else 1.0,
                                    "quorum_port_hello_s": 60.0 if loose else 5.0}))
    async with job("secure", "--settings", str(settings)) as (ctl, legit, _, _beating):
        port = resolve(ctl.quorum, ctl.grpc)
        base = rss(ctl)
        strangers = await asyncio.to_thread(_strangers, port, 20)
        joined = legit.quorum_request(step=legit.step, incarnation="lead-1")
        [insider] = await asyncio.to_thread(_strangers, port, 1, frame(JOIN, joined.SerializeToString()))
        grown = rss(ctl) - base
        try:
            if loose:
                assert grown > 90, grown  # 21 × 6 MiB held
                return
            assert grown < 48, grown
            codes = await asyncio.gather(*(asyncio.to_thread(_refusal, s) for s in strangers + [insider]))
            # every one cut off (the insider too): over the bound, or past its frame's (or, before
            # a join, its hello's) deadline
            assert "open" not in codes, codes
            assert set(codes) <= {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "reset", "closed"}, codes
            # ... and the bound cut some off, as the controller counts it: a client may read only a
            # reset (the port closed with the client's bytes unread, and the reset can arrive before
            # the refusal is read: under load, every one of them did once)
            assert (await port_refusals(ctl)).get("RESOURCE_EXHAUSTED", 0) >= 1, codes
        finally:
            for s in strangers + [insider]:
                s.close()
        # Alone, with room in the buffer, a leader that trickles a frame after its join is cut
        # off by the frame's deadline.
        await legit.resume(ctl.http)
        [alone] = await asyncio.to_thread(_strangers, port, 1, frame(JOIN, legit.quorum_request(
            incarnation="lead-1").SerializeToString()))
        try:
            assert await asyncio.to_thread(_refusal, alone) == "DEADLINE_EXCEEDED"
        finally:
            alone.close()
        await legit.resume(ctl.http)
        await legit.still_served(ctl.http)
