"""An in-process stand-in for the controller's agent-facing RPCs, for agent tests.

It records registrations, heartbeats, acks and exit reports, and lets a test push orders
to a host's order stream. `refuse` makes RegisterAgent answer `refuse_code` (FAILED_PRECONDITION),
`refuse_claims` refuses registrations that claim an assignment with INVALID_ARGUMENT, `busy`
makes it answer ABORTED (another live agent holds the host) that many times; `job_state` is
what heartbeat and registration answers say about the job, `job_id` which job registration
answers name; registration answers carry assignment version `version`. Deregistrations are recorded in `deregistrations`. Like the real
controller it hands out an agent secret per new incarnation, and it records the secret each
order stream, ack and exit report presented (`presented`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pb_grpc


class FakeController(pb_grpc.ControllerServicer):
    def __init__(self) -> None:
        self.registrations: list[pb.RegisterAgentRequest] = []
        self.heartbeats: defaultdict[str, int] = defaultdict(int)
        #: host id -> trainers still finishing after COMPLETED, as its last heartbeat said
        self.finishing: dict[str, int] = {}
        self.acks: dict[str, pb.AckOrderRequest] = {}
        self.exits: list[pb.TrainerExitRequest] = []
        self.queues: defaultdict[str, asyncio.Queue] = defaultdict(asyncio.Queue)
        self.streams: defaultdict[str, int] = defaultdict(int)
        self.refuse = ""
        self.refuse_code = grpc.StatusCode.FAILED_PRECONDITION  # the status `refuse` answers with
        self.refuse_claims = ""  # refuse registrations that claim an assignment (INVALID_ARGUMENT)
        self.answer: pb.Assignment | None = None  # overrides the registered assignment
        self.not_leader = False
        self.leader_address = ""  # named in not_leader answers
        self.mute = False    # read heartbeats but never answer (a frozen process)
        self.forget = 0      # answer this many heartbeats with "unknown host"
        self.fail_exits = 0  # refuse this many exit reports with UNAVAILABLE
        self.busy = 0        # answer this many registrations with ABORTED
        self.version = 3
        self.deregistrations: list[pb.DeregisterAgentRequest] = []
        self.job_state = pb.RUNNING
        self.job_id = "job"  # the job id registration answers name
        self.server: grpc.aio.Server | None = None
        self.address = ""
        #: incarnation -> the secret handed out for it; (rpc, secret) for every call that
        #: must present one
        self.secrets: dict[str, str] = {}
        self.presented: list[tuple[str, str]] = []

    async def start(self, credentials: grpc.ServerCredentials | None = None, port: int = 0) -> "FakeController":
        self.server = grpc.aio.server()
        pb_grpc.add_ControllerServicer_to_server(self, self.server)
        if credentials is not None:
            port = self.server.add_secure_port(f"127.0.0.1:{port}", credentials)
        else:
            port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{port}"
        await self.server.start()
        return self

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(grace=0.1)

    def order(self, host_id: str, order_id: str, kind: int, assignment=None,
              reason: str = "test") -> None:
        self.queues[host_id].put_nowait(pb.Order(order_id=order_id, kind=kind,
                                                 assignment=assignment, reason=reason))

    async def RegisterAgent(self, request, context):
        if self.refuse:
            await context.abort(self.refuse_code, self.refuse)
        self.registrations.append(request)
        if self.refuse_claims and request.HasField("assignment"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.refuse_claims)
        if self.busy > 0:
            self.busy -= 1
            await context.abort(grpc.StatusCode.ABORTED, "host is held by a live agent; Retry later.")
        assignment = pb.Assignment()
        assignment.CopyFrom(self.answer if self.answer is not None else request.assignment)
        assignment.version = assignment.version or self.version
        new = request.incarnation not in self.secrets
        secret = self.secrets.setdefault(request.incarnation, f"secret-{len(self.secrets)}")
        return pb.RegisterAgentResponse(assignment=assignment, reason="fake", job_state=self.job_state,
                                        agent_secret=secret if new else "", job_id=self.job_id)

    async def Heartbeat(self, request_iterator, context):
        async for request in request_iterator:
            for host_id in request.host_ids:
                self.heartbeats[host_id] += 1
                self.finishing[host_id] = request.finishing_trainers
            if self.mute:
                continue
            unknown = list(request.host_ids) if self.forget > 0 else []
            self.forget -= bool(unknown)
            yield pb.HeartbeatResponse(not_leader=self.not_leader, unknown_ids=unknown,
                                       job_state=self.job_state,
                                       leader_address=self.leader_address if self.not_leader else "")

    async def Orders(self, request, context):
        self.presented.append(("Orders", request.agent_secret))
        self.streams[request.host_id] += 1
        queue = self.queues[request.host_id]
        while True:
            yield await queue.get()

    async def AckOrder(self, request, context):
        self.presented.append(("AckOrder", request.agent_secret))
        self.acks[request.order_id] = request
        return pb.AckOrderResponse()

    async def DeregisterAgent(self, request, context):
        self.presented.append(("DeregisterAgent", request.agent_secret))
        self.deregistrations.append(request)
        return pb.DeregisterAgentResponse()

    async def ReportTrainerExit(self, request, context):
        self.presented.append(("ReportTrainerExit", request.agent_secret))
        if self.fail_exits > 0:
            self.fail_exits -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        self.exits.append(request)
        return pb.TrainerExitResponse()
