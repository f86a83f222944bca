"""gRPC handlers: validate, step the core with the request's command, convert the answer.
Refusals map in errors.py."""

from __future__ import annotations

import asyncio
import logging

import grpc

from controller.core.checks import check_id, shown
from controller.core import commands as c
from controller.service import callers, decoding
from controller.core.errors import FailedPrecondition, InvalidArgument, RequestError
from controller.core.identity import hash_secret
from controller.core.model import JobState, JoinRequest
from controller.service.errors import NotLeader, refuse, unary
from controller.store import StoreError
from controller.service.orders import from_proto_assignment, to_proto_assignment, to_proto_order
from controller.service.peer import new_agent_secret
from controller.service.telemetry_wire import from_proto_report
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc

log = logging.getLogger("fthsdp.controller")

SERVICE_NAME = "fthsdp.v1.Controller"
JOB_STATES = {JobState.RUNNING: pb.RUNNING, JobState.COMPLETED: pb.COMPLETED, JobState.FAILED: pb.FAILED}


#: how long a QuorumStream whose requests ended waits to see whether its call is cancelled
#: (the peer is gone) rather than ended by a goodbye
STREAM_END_S = 0.5


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    def __init__(self, server) -> None:
        self.server = server

    def _check_job(self, job_id: str) -> None:
        expected = self.server.settings.job_id
        if job_id and job_id != expected:
            raise FailedPrecondition(f"job_id {shown(job_id)} does not match this controller's job {expected!r}.")

    def _check_beat(self, beat, context) -> None:
        s = self.server.settings
        if len(beat.host_ids) + len(beat.replica_ids) > s.max_hosts + s.max_replica_records:
            raise InvalidArgument(f"a heartbeat names {len(beat.host_ids) + len(beat.replica_ids)} ids; the limit is "
                                  f"{s.max_hosts + s.max_replica_records} (max_hosts + replica records).")
        for kind, ids in (("host_ids", beat.host_ids), ("replica_ids", beat.replica_ids)):
            for i, key in enumerate(ids):
                check_id(f"{kind}[{i}]", key, s.max_id_chars)
        for host_id in beat.host_ids:
            self.server.check_peer_may_act_as(context, host_id)
        callers.check_beat(self.server, self.server.state, beat)

    def _check_coordinator(self, request, context) -> None:
        """A replica coordinator's job, and (with a certificate binding) the host it says it runs on."""
        self._check_job(request.job_id)
        if request.host_id:
            self.server.check_peer_may_act_as(context, request.host_id)
        callers.check_coordinator(self.server, self.server.require_leader(), request)

    def begin_join(self, request: pb.QuorumRequest, context, encoded: bool) -> asyncio.Future:
        """Check a coordinator's join and enter it in this round; returns the future the settle
        answers once the round closes: with the answer's bytes (`encoded`) or the message.
        The quorum port (quorum_port.py) joins through here too; `context` is the call, or
        the port's connection, which answers `auth_context()` alike."""
        self._check_coordinator(request, context)
        fut = asyncio.get_running_loop().create_future()
        self.server.join(JoinRequest(
            replica_id=request.replica_id, step=request.step, world_size=request.world_size,
            # the lists are counted before they are copied (a million entries cost nothing)
            incarnation=request.incarnation, ftar_addresses=request.ftar_addresses,
            state_addresses=request.state_addresses, coordinator_address=request.leader_address,
            host_id=request.host_id, checkpoint_every_steps=request.checkpoint_every_steps,
        ), (fut, request.known_quorum_id, encoded))
        return fut

    async def _join(self, request: pb.QuorumRequest, context, encoded: bool):
        """Join this round; once it closes, the answer shared by every member."""
        fut = self.begin_join(request, context, encoded)
        try:
            return await fut
        except asyncio.CancelledError:
            # The coordinator hung up (its process died, or it gave up waiting): its join goes too.
            self.server.forget_waiter(request.replica_id, fut, "its coordinator's Quorum call ended (cancelled or "
                                                                "connection closed)")
            raise

    @unary
    async def Quorum(self, request, context):
        # The message, serialized by gRPC per call: with the identity serializer here, refused
        # requests were not freed promptly (tests/security: the attack volley's memory bound).
        return await self._join(request, context, encoded=False)

    async def QuorumStream(self, request_iterator, context):
        """One coordinator's rounds on one stream: read a join, answer it, read the next. A refusal
        ends the stream with its code (as the unary call would have failed)."""
        replica_id = None
        try:
            async for request in request_iterator:
                if replica_id is None:
                    replica_id = request.replica_id
                elif request.replica_id != replica_id:
                    raise FailedPrecondition(f"this stream carries replica {shown(replica_id)}; a request for "
                                             f"{shown(request.replica_id)} needs its own stream.")
                yield await self._join(request, context, encoded=True)
            if replica_id is not None:
                # The requests ended: a goodbye, or a lost connection -- grpc ends the requests
                # of a call whose peer is gone too, then cancels the call a moment later.
                await asyncio.sleep(STREAM_END_S)
        except (RequestError, NotLeader, StoreError) as exc:
            refuse(context, "QuorumStream", exc)
        except asyncio.CancelledError:
            # cancelled without goodbye, while its coordinator waited for an answer, between two
            # joins, or just after its requests ended: its process or host may be gone
            if replica_id is not None and self.server.leading:
                self.server.coordinator_connection_lost(replica_id, "its coordinator's QuorumStream")
            raise

    async def Heartbeat(self, request_iterator, context):
        async for beat in request_iterator:
            if not self.server.leading:
                yield pb.HeartbeatResponse(not_leader=True, leader_address=self.server.leader_address)
                continue
            try:
                self._check_beat(beat, context)
                state = self.server.state
                unknown = await self.server.apply(c.Heartbeat(tuple(beat.host_ids), tuple(beat.replica_ids),
                                                              max(beat.finishing_trainers, 0)))
            except (RequestError, NotLeader, StoreError) as exc:
                refuse(context, "Heartbeat", exc)
                return
            yield pb.HeartbeatResponse(unknown_ids=unknown, job_state=JOB_STATES[state.job_state],
                                       job_state_reason=state.job_end_reason if state.job_over else "")

    @unary
    async def ReportStep(self, request, context):
        return await self.report_step(request, context)

    async def report_step(self, request: pb.ReportStepRequest, context) -> pb.ReportStepResponse:
        """A coordinator's commit report, answered once the store holds it (the quorum port's too)."""
        self._check_coordinator(request, context)
        await self.server.apply(c.ReportStep(
            request.replica_id, request.step, quorum_id=request.quorum_id, loss=request.loss,
            step_time_s=request.step_time_s, tokens=request.tokens, host_id=request.host_id,
            digest=request.digest, caught_up=request.caught_up, rank_digests=tuple(request.rank_digests),
            checkpoint_step=request.checkpoint_step if request.HasField("checkpoint_step") else None))
        return pb.ReportStepResponse()

    @unary
    async def ReportFinished(self, request, context):
        self._check_coordinator(request, context)
        job_state = await self.server.apply(c.ReportFinished(request.replica_id, request.step, reason=request.reason,
                                                             host_id=request.host_id))
        return pb.ReportFinishedResponse(job_state=JOB_STATES[job_state])

    @unary
    async def ReportFailure(self, request, context):
        self._check_coordinator(request, context)
        if request.kind == pb.ReportFailureRequest.COMMIT_FAILED:
            command = c.ReportCommitFailed(request.replica_id, request.step, request.reason,
                                           quorum_id=request.quorum_id, host_id=request.host_id)
        elif request.kind == pb.ReportFailureRequest.REPLICA_DEAD:
            command = c.ReportReplicaDead(request.replica_id, request.reason, host_id=request.host_id)
        else:
            raise InvalidArgument(f"failure kind {request.kind} is not COMMIT_FAILED or REPLICA_DEAD.")
        await self.server.apply(command)
        return pb.ReportFailureResponse()

    @unary
    async def RegisterAgent(self, request, context):
        state = self.server.require_leader()
        self.server.check_peer_may_act_as(context, request.host_id)
        limit = self.server.settings.max_slots_per_host
        if len(request.assignment.ranks) > limit:  # counted before the ranks are copied
            raise InvalidArgument(f"assignment names {len(request.assignment.ranks)} ranks; one host runs at most "
                                  f"{limit}.")
        callers.check_registration(self.server, request)
        claimed = from_proto_assignment(request.assignment) if request.HasField("assignment") else None
        secret = new_agent_secret()
        assignment, reason = await self.server.apply(c.RegisterAgent(
            request.host_id, request.incarnation, spare=request.spare, slots=request.slots,
            labels=request.labels, assignment=claimed, secret_hash=hash_secret(secret),
            address=request.address, rendezvous_port=request.rendezvous_port,
            coordinator_port=request.coordinator_port, previous_secret=request.previous_secret,
            standby=request.standby))
        hosts = state
        host = hosts.hosts[request.host_id]
        issued = host.secret_hash == hash_secret(secret)
        rid = assignment.replica_id if assignment else ""
        return pb.RegisterAgentResponse(
            assignment=to_proto_assignment(assignment, host.assignment_version, hosts.replica_versions.get(rid, 0),
                                           hosts.replica_endpoints(rid)),
            reason=reason, job_id=self.server.settings.job_id, job_state=JOB_STATES[state.job_state],
            agent_secret=secret if issued else "", job_state_reason=state.job_end_reason if state.job_over else "")

    async def Orders(self, request, context):
        server = self.server
        try:
            state = server.require_leader()
            server.check_peer_may_act_as(context, request.host_id)
            host = state.authenticate_agent(request.host_id, request.agent_secret)
            if host.incarnation != request.incarnation:
                raise FailedPrecondition(
                    f"host {request.host_id} incarnation {shown(request.incarnation)} is not the registered one "
                    f"({host.incarnation!r}); register again.")
        except (RequestError, NotLeader) as exc:
            refuse(context, "Orders", exc)
            return
        queue: asyncio.Queue = asyncio.Queue()
        old = server.order_streams.get(request.host_id)
        if old is not None:
            old.put_nowait(None)
        server.order_streams[request.host_id] = queue
        pending = server.pending_orders.pop(request.host_id, None)
        first = server.submit(c.ConnectOrders(request.host_id, pending)).answer
        if pending is not None and pending not in first:
            log.info("host %s: dropped order %s %s, superseded by its current assignment", request.host_id,
                     pending.order_id, pending.kind)
        for order in first:
            queue.put_nowait(to_proto_order(order))
        try:
            while True:
                order = await queue.get()
                if order is None:
                    return
                yield order
        finally:
            if server.order_streams.get(request.host_id) is queue:
                del server.order_streams[request.host_id]

    @unary
    async def AckOrder(self, request, context):
        state = self.server.require_leader()
        self.server.check_peer_may_act_as(context, request.host_id)
        state.authenticate_agent(request.host_id, request.agent_secret)
        await self.server.apply(c.AckOrder(request.host_id, request.order_id, request.ok, request.error))
        return pb.AckOrderResponse()

    @unary
    async def ReportTelemetry(self, request, context):
        state = self.server.require_leader()
        self.server.check_peer_may_act_as(context, request.host_id)
        ignored = await self.server.apply(c.Telemetry(from_proto_report(request), request.agent_secret))
        return pb.TelemetryResponse(ignored=ignored[:64])

    @unary
    async def ReportTrainerExit(self, request, context):
        state = self.server.require_leader()
        self.server.check_peer_may_act_as(context, request.host_id)
        state.authenticate_agent(request.host_id, request.agent_secret)
        await self.server.apply(c.TrainerExit(
            request.host_id, request.replica_id, request.rank, exit_code=request.exit_code, signal=request.signal,
            stderr_tail=request.stderr_tail, gave_up=request.gave_up, version=request.version))
        return pb.TrainerExitResponse()

    @unary
    async def DeregisterAgent(self, request, context):
        state = self.server.require_leader()
        self.server.check_peer_may_act_as(context, request.host_id)
        state.authenticate_agent(request.host_id, request.agent_secret)
        await self.server.apply(c.DeregisterAgent(request.host_id, request.incarnation, request.reason))
        return pb.DeregisterAgentResponse()


#: Methods whose handlers return answers already encoded (see QuorumAnswers.encoded).
PRE_ENCODED = ("QuorumStream",)


def add_to_server(servicer: ControllerServicer, server) -> None:
    """Register the Controller service like the generated adder does, except that the quorum
    stream sends the bytes its handler yields as they are (no per-answer serialization)."""
    handlers = {}

    class Collect:
        def add_generic_rpc_handlers(self, generic):
            pass

        def add_registered_method_handlers(self, service, method_handlers):
            handlers.update(method_handlers)

    controller_pb2_grpc.add_ControllerServicer_to_server(servicer, Collect())
    handlers = decoding.guard(SERVICE_NAME, handlers)  # undecodable requests: INVALID_ARGUMENT
    for name in PRE_ENCODED:
        h = handlers[name]
        make = grpc.unary_unary_rpc_method_handler if not h.request_streaming else grpc.stream_stream_rpc_method_handler
        handlers[name] = make(h.unary_unary or h.stream_stream, request_deserializer=h.request_deserializer,
                              response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


__all__ = ["ControllerServicer", "NotLeader", "add_to_server"]
