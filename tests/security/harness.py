"""A real controller process under attack, the legitimate parties it serves, and what the tests
compare: REST views before and after, and the process's resident memory.

The legitimate parties are one agent ("h0", holding replica r0's only rank, with its order
stream open) and r0's leader on that host. Attacks come over the same loopback gRPC port.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import grpc
import httpx

from bench.procstat import rss_mib
from controller.launch import ControllerProcess, launch
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import credentials, job_secret

#: The job secret of every controller started here (unless started with --insecure).
SECRET = job_secret.parse(job_secret.generate(), "the security tests")

JOB = "sec"
HOST, REPLICA, INCARNATION = "h0", "r0", "h0-incarnation"
#: Bigger than every text bound, smaller than the 8 MiB request limit.
HUGE = 2 << 20
#: The views a refused request must leave as they were.
VIEWS = ("/api/v1/job", "/api/v1/replicas", "/api/v1/hosts", "/api/v1/quorums", "/api/v1/events?limit=1000")
#: What changes by itself: time since a party was seen, goodput (derived from the clock), and
#: the open round's reason (the ticker looks at the round again: "all joined" becomes "nobody
#: joined yet").
DRIFTING = ("seconds_since_seen", "round_reason", "goodput")


def controller_flags(*extra: str) -> tuple[str, ...]:
    return ("--job-id", JOB, "--replicas", "1", "--min-replicas", "1", "--join-timeout-s", "1",
            "--heartbeat-timeout-s", "60", "--log-level", "WARNING", *extra)


def start_controller(*extra: str, insecure: bool = False, **kw) -> ControllerProcess:
    """A controller holding SECRET (given in its environment), or one started with --insecure."""
    if insecure:
        return launch(*controller_flags(*extra, "--insecure"), **kw)
    env = {**os.environ, job_secret.ENV_JOB_SECRET: SECRET.hex()}
    env.pop(job_secret.ENV_JOB_SECRET_FILE, None)
    return launch(*controller_flags(*extra), env=env, **kw)


def proof(host_id: str, incarnation: str, secret=SECRET) -> str:
    """What a real agent holding `secret` sends with its registration."""
    return credentials.registration_proof(secret, host_id, incarnation, time.time())


def register_request(host_id: str = HOST, incarnation: str = INCARNATION, **kw) -> pb.RegisterAgentRequest:
    """h0's registration as its real agent sends it (r0's only rank), with its proof."""
    fields = dict(host_id=host_id, incarnation=incarnation, slots=1, proof=proof(host_id, incarnation),
                  assignment=pb.Assignment(replica_id=REPLICA, ranks=[0], world_size=1))
    return pb.RegisterAgentRequest(**{**fields, **kw})


#: What r0's leader on h0 shows: h0's trainer token, as h0's agent hands it.
LEADER_CREDENTIAL = credentials.host_credential(credentials.trainer_token(SECRET, HOST))


def _strip(value):
    if isinstance(value, dict):
        out = {k: _strip(v) for k, v in value.items() if k not in DRIFTING}
        if isinstance(out.get("round"), dict):
            out["round"].pop("reason", None)
        return out
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


async def picture(http_url: str) -> dict:
    """Every status view, without the fields that change by themselves."""
    async with httpx.AsyncClient(base_url=http_url, timeout=30, verify=False) as http:
        out = {}
        for path in VIEWS:
            reply = await http.get(path)
            assert reply.status_code == 200, (path, reply.status_code, reply.text[:500])
            out[path] = _strip(reply.json())
        return out


def rss(ctl: ControllerProcess) -> float:
    return rss_mib(ctl.pid)


async def settled_rss(ctl: ControllerProcess, bound_s: float = 30.0) -> float:
    """The RSS once two readings a second and a half apart (past the trimmer's interval,
    controller/freed_memory.py) differ by less than 1 MiB: what stays, not the buffers a volley
    just freed; bounded."""
    deadline = asyncio.get_running_loop().time() + bound_s
    previous = rss(ctl)
    while True:
        await asyncio.sleep(1.5)  # the pace of the readings; the condition is the RSS's
        now = rss(ctl)
        if abs(now - previous) < 1.0:
            return now
        assert asyncio.get_running_loop().time() < deadline, f"the RSS never settled (last {previous:.1f}, {now:.1f})"
        previous = now


@dataclass
class Legit:
    """The legitimate agent and leader of r0, talking to the controller like the real ones."""

    stub: pbg.ControllerStub
    secret: str = ""
    orders: object = None  # the agent's open order stream
    quorum_id: int = 0
    step: int = 0

    async def resume(self, http_url: str) -> "Legit":
        """Pick up where the replica is: its next step and the current quorum."""
        async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
            reps = {r["replica_id"]: r for r in (await http.get("/api/v1/replicas")).json()}
            current = (await http.get("/api/v1/quorums")).json()["current"]
        self.step = reps[REPLICA]["committed_step"] + 1 if REPLICA in reps else 0
        self.quorum_id = current["quorum_id"] if current else 0
        return self

    async def register(self) -> None:
        reply = await self.stub.RegisterAgent(register_request(), timeout=10)
        assert reply.agent_secret and reply.assignment.replica_id == REPLICA
        self.secret = reply.agent_secret
        self.orders = self.stub.Orders(pb.OrdersRequest(host_id=HOST, incarnation=INCARNATION,
                                                        agent_secret=self.secret))

    def quorum_request(self, **kw) -> pb.QuorumRequest:
        fields = dict(job_id=JOB, replica_id=REPLICA, step=self.step, world_size=1, incarnation="lead-1",
                      ftar_addresses=["127.0.0.1:7001"], state_addresses=["127.0.0.1:7002"], host_id=HOST,
                      known_quorum_id=self.quorum_id, credential=LEADER_CREDENTIAL)
        return pb.QuorumRequest(**{**fields, **kw})

    async def join(self) -> pb.QuorumResponse:
        q = await self.stub.Quorum(self.quorum_request(), timeout=10)
        self.quorum_id, self.step = q.quorum_id, q.max_step
        return q

    def report(self, **kw) -> pb.ReportStepRequest:
        fields = dict(job_id=JOB, replica_id=REPLICA, quorum_id=self.quorum_id, step=self.step, host_id=HOST,
                      step_time_s=0.5, loss=1.0, tokens=10, credential=LEADER_CREDENTIAL)
        return pb.ReportStepRequest(**{**fields, **kw})

    async def beat(self) -> None:
        """A heartbeat for h0, as its real agent sends every second (a long module must not
        outlast the heartbeat timeout; r0's joins keep r0 alive)."""
        async def beats():
            yield pb.HeartbeatRequest(host_ids=[HOST], agent_secret=self.secret)
        [reply] = [r async for r in self.stub.Heartbeat(beats(), timeout=10)]
        assert not reply.unknown_ids, reply

    async def step_once(self) -> None:
        """One whole step as the real leader does it: quorum, then the commit report."""
        await self.beat()
        await self.join()
        await self.stub.ReportStep(self.report(), timeout=10)
        self.step += 1

    async def still_served(self, http_url: str) -> None:
        """The legitimate parties are unaffected: a step commits, and an order still reaches
        the agent's stream."""
        before = self.step
        await self.step_once()
        async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
            reps = {r["replica_id"]: r for r in (await http.get("/api/v1/replicas")).json()}
        assert reps[REPLICA]["committed_step"] == before and reps[REPLICA]["state"] == "HEALTHY"


async def beat_forever(stub, host_id: str, secret: str, replica_id: str = "", credential: str = "") -> None:
    """What a live agent (and a leader) send: a beat every 0.3 s on one stream."""
    async def beats():
        while True:
            yield pb.HeartbeatRequest(host_ids=[host_id], agent_secret=secret,
                                      replica_ids=[replica_id] if replica_id else [], credential=credential,
                                      host_id=host_id)
            await asyncio.sleep(0.3)
    async for reply in stub.Heartbeat(beats()):
        assert not reply.unknown_ids, reply


async def expect_refused(call, code: grpc.StatusCode, *fragments: str) -> str:
    """Await `call`; it must fail with `code`, and its message must hold every fragment and
    stay short (a refusal never echoes a huge value back)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        details = exc.details() or ""
        assert exc.code() == code, (exc.code(), details[:300])
        for fragment in fragments:
            assert fragment in details, (fragment, details[:300])
        assert len(details) < 2000, len(details)
        return details
    raise AssertionError(f"the call was accepted; expected {code.name} with {fragments}")


async def open_channel(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.aio.insecure_channel(address, options=options)


async def next_order(orders, timeout_s: float = 10.0) -> pb.Order:
    return await asyncio.wait_for(orders.read(), timeout_s)
