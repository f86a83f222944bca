"""The agent: register, heartbeat, take orders, report exits; supervise trainers meanwhile.

I/O shell around the pure parts (`orders.plan_order`, `policy.next_action`,
`protos.dial.AddressRotation`). One session = one controller address: register, then
heartbeat + order stream + exit reports together until something breaks. A broken session
moves on as AddressRotation says: to the leader a standby named, else the next address, at
once; a pause only after a whole pass of failures. A controller that stops answering
heartbeats for rpc_timeout_s counts as failed (a frozen process keeps its connections
open). A refused registration ends the agent (`PermanentError`) only when `refusals.after_refusal`
says the host may not take part; a refused claim of work it runs is asked again without it. When the controller
says the job is COMPLETED (in a heartbeat or registration answer), trainers stop and the agent
ends (or idles, `on_job_complete`), as `policy.after_job_state` decides.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import shutil
import tempfile
import time
import uuid
from typing import AsyncIterator, Callable

import grpc

from agent import orders, refusals, state_file
from agent.orders import Assignment, Effect
from agent.policy import (JobEnd, Want, after_job_state, gives_up_on_controller, keep_trainers_past_timeout,
                          serves_next_job)
from agent.ports import pick_ports
from agent.proofs import registration_proof
from agent.process import ProcessHooks, SubprocessHooks
from agent.settings import AgentSettings
from agent.supervisor import Supervisor, TrainerExit
from agent.telemetry import Collector, ring_dir
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pb_grpc
from protos import dial

log = logging.getLogger(__name__)

# Answers that retrying cannot fix.
_PERMANENT = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
              grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED,
              grpc.StatusCode.UNAUTHENTICATED)
_REMEMBERED_ORDERS = 1024


class PermanentError(Exception):
    """The controller refused this agent; retrying will not help."""


class ConnectTimeout(Exception):
    """No controller address answered for connect_timeout_s (reconnect_timeout_s once one had
    answered): the agent gives up."""


class _Reconnect(Exception):
    """Register again with the same controller: it forgot this host, ended the stream, or
    asked to be asked again later (another live agent holds the host)."""

    def __init__(self, why: str, forgotten: bool = False, delay_s: float = 0.0, held: bool = False) -> None:
        super().__init__(why)
        self.forgotten = forgotten
        self.delay_s = delay_s
        #: another live agent holds the host id
        self.held = held


class _NotLeader(Exception):
    """This controller is a standby: try the leader it names, or the next address."""

    def __init__(self, why: str, leader_address: str = "") -> None:
        super().__init__(why)
        self.leader_address = leader_address


class Agent:
    def __init__(self, settings: AgentSettings, hooks: ProcessHooks | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 base_env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self._clock = clock
        self.incarnation = uuid.uuid4().hex
        #: Given by the controller when this incarnation registers; presented on the order
        #: stream, acks and exit reports. Never logged.
        self._secret = ""
        #: The secret a previous agent process of this host kept (agent.state_file): presented
        #: once, to take the host over at once.
        self._state_path = state_file.path_for(settings.state_dir, settings.host_id) if settings.state_dir else None
        self._previous_secret = state_file.read_secret(self._state_path) if self._state_path else ""
        #: (rendezvous, coordinator) ports of this host: given, or free ones picked now
        given = (settings.rendezvous_port, settings.coordinator_port)
        picked = iter(pick_ports(given.count(0), avoid=frozenset(given)))
        self.ports: tuple[int, int] = (given[0] or next(picked), given[1] or next(picked))
        #: the controller address of the last registration (a clean stop deregisters there)
        self._address = settings.controller_addresses[0]
        #: why the agent stops, for its deregistration (set by whoever sets the stop event)
        self.stop_reason = "the agent was stopped"
        self._retry_logged = False
        self.assignment: Assignment | None = (
            Assignment(settings.replica_id, settings.ranks, settings.world_size)
            if settings.replica_id else None)
        #: the controller's version of `assignment` (0: none known yet); see agent.orders
        self.version = 0
        self._pending: collections.deque[TrainerExit] = collections.deque()
        self._pending_event = asyncio.Event()
        self._all_sent = asyncio.Event()  # no exit report waits to be sent
        self._all_sent.set()
        self._acks: collections.OrderedDict[str, tuple[bool, str]] = collections.OrderedDict()
        self.supervisor = Supervisor(settings, hooks or SubprocessHooks(
            settings.stderr_tail_lines, on_exit=lambda: self.supervisor.wake.set()),
            self._queue_exit, clock, dict(os.environ if base_env is None else base_env))
        self._collector = Collector(settings.host_id, settings.telemetry_window_collectives)
        self.registered = asyncio.Event()
        #: set once the controller said the job is COMPLETED or FAILED: no trainer starts again
        self.job_completed = asyncio.Event()
        #: how the job ended, as the controller said ("COMPLETED", "FAILED"; "" while it runs)
        self.job_ending = ""
        self._quit = asyncio.Event()
        #: once the job COMPLETED with on_job_complete "exit": ends the sessions when no trainer finishes
        self._leaving: asyncio.Task | None = None

    # ------------------------------------------------------------------ top level

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set (or PermanentError). Trainers are stopped on the way out."""
        made_dir = self._telemetry_dir()
        try:
            await self._run(stop)
        finally:
            if made_dir:
                shutil.rmtree(made_dir, ignore_errors=True)

    def _telemetry_dir(self) -> str:
        """Where trainers keep their rings; returns the directory if this agent made it."""
        s = self.settings
        if not s.telemetry_interval_s:
            return ""
        if s.telemetry_dir:
            os.makedirs(s.telemetry_dir, mode=0o700, exist_ok=True)
            self.supervisor.telemetry_dir = s.telemetry_dir
            return ""
        self.supervisor.telemetry_dir = tempfile.mkdtemp(prefix=f"fthsdp-telemetry-{s.host_id[:32]}-",
                                                         dir=ring_dir())
        return self.supervisor.telemetry_dir

    async def _run(self, stop: asyncio.Event) -> None:
        supervising = asyncio.Event()
        loop_task = asyncio.create_task(self.supervisor.run(supervising))
        relay = asyncio.create_task(_relay(stop, self._quit))
        try:
            await self._sessions(self._quit)
        finally:
            relay.cancel()
            if stop.is_set() and self._secret and not self.job_completed.is_set():
                await self._deregister()  # a clean stop: the controller moves the work at once
            if self.supervisor.finish_by_s is not None:  # trainers' own work after close is theirs
                await self.supervisor.finished()
            if self._leaving is not None:
                self._leaving.cancel()
            supervising.set()
            self.supervisor.wake.set()
            await loop_task
            await self.supervisor.shutdown()

    async def _sessions(self, stop: asyncio.Event) -> None:
        s = self.settings
        rotation = dial.AddressRotation(s.controller_addresses, base_s=s.reconnect_base_s,
                                        cap_s=s.reconnect_cap_s)
        outage = dial.Outage(s.connect_timeout_s, s.reconnect_timeout_s)
        outage.since = self._clock()  # no controller answered since
        held_since: float | None = None  # since when another live agent holds this host id
        kept = ""  # why trainers are kept past the reconnect timeout ("" : they are not)
        while not stop.is_set():
            address = rotation.current
            try:
                async with dial.aio_channel(address, s.tls) as channel:
                    stub = pb_grpc.ControllerStub(channel)
                    await self._register(stub, address)
                    rotation.succeeded()
                    outage.succeeded()
                    held_since, kept = None, ""
                    await self._session(stub, stop)
                continue
            except _Reconnect as exc:
                if exc.forgotten:
                    # The controller declared this agent dead or lost it: to the controller
                    # this is a new agent, so it gets a new identity (a same-incarnation
                    # registration would be read as the old, dead one).
                    self.incarnation, self._secret = uuid.uuid4().hex, ""
                if exc.held:
                    # Another agent holds the host id: wait while it may be a dead predecessor
                    # (declared dead after the controller's heartbeat timeout); one that stays
                    # alive this long is a second agent started with the same host id.
                    now = self._clock()
                    held_since = now if held_since is None else held_since
                    if now - held_since + exc.delay_s > s.connect_timeout_s:
                        raise PermanentError(
                            f"host {s.host_id}: another agent with the same host id is alive and registered: "
                            f"{exc}; refused for {now - held_since:.0f} s (--connect-timeout-s "
                            f"{s.connect_timeout_s:g}): give this agent another --host-id, or stop the other "
                            f"one") from exc
                if not exc.delay_s or not self._retry_logged:
                    log.log(logging.WARNING if exc.delay_s else logging.INFO, "host %s: %s; registering again",
                            s.host_id, exc)
                self._retry_logged = self._retry_logged or bool(exc.delay_s)
                delay = exc.delay_s or s.reconnect_base_s  # no hot loop if a stream keeps ending
            except (grpc.aio.AioRpcError, _NotLeader) as exc:
                if isinstance(exc, grpc.aio.AioRpcError):
                    why, hint = f"{exc.code().name}: {exc.details()}", dial.leader_hint(exc)
                else:
                    why, hint = str(exc), exc.leader_address
                delay = rotation.failed(hint, jitter=random.random() * 0.5)
                now = self._clock()
                flag = "--reconnect-timeout-s" if outage.answered else "--connect-timeout-s"
                past = outage.failed(now, delay)
                serving = self.registered.is_set() and not self.job_completed.is_set()
                gives_up = gives_up_on_controller(s.on_job_complete, serving)
                if not gives_up:  # a pool agent between jobs waits for the next job's controller
                    if outage.attempts == 1:
                        log.info("host %s: in the pool, waiting for a job's controller at %s (%s)", s.host_id,
                                 address, why)
                    past = False
                keep = keep_trainers_past_timeout(outage.length(now) + delay, outage.limit_s, outage.answered,
                                                  len(self.supervisor.training())) if past else ""
                if keep and not kept:
                    log.warning("host %s: no controller answered for %.1f s (%s %g): %s", s.host_id,
                                outage.length(now), flag, outage.limit_s, keep)
                kept = keep or kept
                if past and not keep:
                    raise ConnectTimeout(
                        f"host {s.host_id}: no controller answered for {outage.length(now):.1f} s "
                        f"({outage.attempts} attempt(s), last {address}: {why}); giving up ({flag} "
                        f"{outage.limit_s:g})") from exc
                if outage.worth_a_line and gives_up:  # once per doubling of the attempts, never one per attempt
                    log.warning("host %s: controller %s failed (%s), attempt %d; trying %s in %.2f s (giving up "
                                "after %g s without an answer, %s)", s.host_id, address, why, outage.attempts,
                                rotation.current, delay, outage.limit_s, flag)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def _register(self, stub: pb_grpc.ControllerStub, address: str) -> None:
        s = self.settings
        address_given = bool(s.advertise_address)
        request = pb.RegisterAgentRequest(
            host_id=s.host_id, spare=s.spare, slots=s.slot_count,
            labels=s.labels, incarnation=self.incarnation,
            assignment=self.assignment.to_proto() if self.assignment else None,
            address=s.advertise_address, rendezvous_port=self.ports[0] if address_given else 0,
            coordinator_port=self.ports[1] if address_given else 0,
            previous_secret="" if self._secret else self._previous_secret, standby=s.standby,
            proof=registration_proof(s, self.incarnation))
        try:
            response = await stub.RegisterAgent(request, timeout=s.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ABORTED:  # another live agent holds the host: wait
                raise _Reconnect(f"controller {address}: {exc.details()}", delay_s=s.reconnect_cap_s,
                                 held=True) from exc
            verdict = refusals.after_refusal(exc.code().name, request.HasField("assignment"),
                                             self.registered.is_set())
            if verdict is not None and verdict.drop_claim:
                log.warning("host %s: controller %s refused its claim of %s (%s: %s): %s", s.host_id, address,
                            self.assignment, exc.code().name, exc.details(), verdict.why)
                self.assignment = None
                raise _Reconnect(f"controller {address} refused the claim") from exc
            if verdict is not None:
                raise PermanentError(f"controller {address} refused host {s.host_id}: "
                                     f"{exc.code().name}: {exc.details()} ({verdict.why})") from exc
            raise
        self._address, self._retry_logged = address, False
        if response.agent_secret:  # a repeated registration of this incarnation keeps the one it has
            self._secret, self._previous_secret = response.agent_secret, ""
            if self._state_path:
                state_file.write_secret(self._state_path, self._secret)
        if self.job_completed.is_set() and serves_next_job(s.on_job_complete, self.supervisor.job_id,
                                                           response.job_id, response.job_state == pb.RUNNING):
            self._back_from_pool(response.job_id, address)
        if not s.job_id and response.job_id:
            self.supervisor.job_id = response.job_id
        given = Assignment.from_proto(response.assignment)
        # The registration answer is the controller's record: adopted as it is, version too
        # (a controller that lost its store may count versions anew; orders follow it).
        self.version = response.assignment.version
        if not (given == self.assignment or given is not None and given.same_work(self.assignment)):
            log.warning("host %s: controller %s says run %s instead of %s (%s)", s.host_id,
                        address, given or "nothing (spare)", self.assignment or "nothing",
                        response.reason or "no reason given")
        else:
            log.info("host %s registered with %s as %s", s.host_id, address,
                     given or "a spare")
        self.assignment = given
        self._job_state(response.job_state, f"registration with {address}", response.job_state_reason)
        self.supervisor.set_wants(self._wants(given, Effect.TRAIN))
        self.registered.set()
        await asyncio.shield(self.supervisor.reconcile())

    async def _session(self, stub: pb_grpc.ControllerStub, stop: asyncio.Event) -> None:
        streams = [self._heartbeats(stub), self._orders(stub), self._report_exits(stub), stop.wait()]
        if self.supervisor.telemetry_dir:
            streams.append(self._report_telemetry(stub))
        tasks = [asyncio.create_task(c) for c in streams]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a session error
            if self.job_completed.is_set():
                await self._send_last_exits()
            if not stop.is_set():
                raise _Reconnect("a stream to the controller ended")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ streams

    async def _heartbeats(self, stub: pb_grpc.ControllerStub) -> None:
        host_id, interval_s = self.settings.host_id, self.settings.heartbeat_interval_s
        silent_s = self.settings.rpc_timeout_s

        async def beats() -> AsyncIterator[pb.HeartbeatRequest]:
            while True:
                yield pb.HeartbeatRequest(host_ids=[host_id], agent_secret=self._secret,
                                          finishing_trainers=len(self.supervisor.finishing()))
                await asyncio.sleep(interval_s)

        call = stub.Heartbeat(beats())
        read: asyncio.Future | None = None
        try:
            while True:
                # Not wait_for: a cancelled wait_for waits for the cancelled read, and a gRPC
                # read does not always end on its own; the call's cancel below ends it.
                read = asyncio.ensure_future(call.read())
                done, _ = await asyncio.wait({read}, timeout=silent_s)
                if not done:
                    raise _NotLeader(f"controller did not answer a heartbeat for {silent_s:g} s")
                response = read.result()
                if response is grpc.aio.EOF:
                    return
                if response.not_leader:
                    raise _NotLeader("controller is not the leader", response.leader_address)
                if host_id in response.unknown_ids:
                    raise _Reconnect("the controller does not know this host (or declared it "
                                     "dead)", forgotten=True)
                self._job_state(response.job_state, "heartbeat", response.job_state_reason)
        finally:
            call.cancel()
            if read is not None:  # its outcome, whatever it is, is of no interest now
                read.cancel()
                read.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _orders(self, stub: pb_grpc.ControllerStub) -> None:
        s = self.settings
        stream = stub.Orders(pb.OrdersRequest(host_id=s.host_id, incarnation=self.incarnation,
                                              agent_secret=self._secret))
        async for order in stream:
            ok, error = await self.handle_order(order)
            try:
                await stub.AckOrder(pb.AckOrderRequest(
                    host_id=s.host_id, order_id=order.order_id, ok=ok, error=error,
                    agent_secret=self._secret),
                    timeout=s.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _PERMANENT:
                    raise
                log.warning("host %s: controller refused the ack of order %s: %s", s.host_id,
                            order.order_id, exc.details())

    async def _report_exits(self, stub: pb_grpc.ControllerStub) -> None:
        host_id = self.settings.host_id
        while True:
            await self._pending_event.wait()
            while self._pending:
                e = self._pending[0]
                try:
                    await stub.ReportTrainerExit(pb.TrainerExitRequest(
                        host_id=host_id, replica_id=e.replica_id, rank=e.rank,
                        exit_code=e.exit_code, signal=e.signal, stderr_tail=e.stderr_tail,
                        version=e.version, agent_secret=self._secret),
                        timeout=self.settings.rpc_timeout_s)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in _PERMANENT:
                        raise  # kept: sent again on the next session
                    log.warning("host %s: controller refused the exit report of replica %s "
                                "rank %d: %s", host_id, e.replica_id, e.rank, exc.details())
                self._pending.popleft()
            self._pending_event.clear()
            self._all_sent.set()

    async def _report_telemetry(self, stub: pb_grpc.ControllerStub) -> None:
        """Every telemetry_interval_s: the rings of the trainers running now, summarized. A
        failed report is only logged (the next one carries its windows); it never ends the
        session, and a controller without the call is not asked again."""
        s = self.settings
        while True:
            await asyncio.sleep(s.telemetry_interval_s)
            trainers = [(slot, rid, rank, self.supervisor.telemetry_file(slot))
                        for slot, rid, rank in self.supervisor.training()]
            if not trainers:
                continue
            report = await asyncio.to_thread(self._collector.collect, trainers, time.monotonic_ns())
            if not report.ranks:
                continue
            report.agent_secret = self._secret
            try:
                answer = await stub.ReportTelemetry(report, timeout=s.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.warning("host %s: the controller takes no telemetry; not sending it", s.host_id)
                    await asyncio.Event().wait()
                log.log(logging.WARNING if exc.code() in _PERMANENT else logging.DEBUG,
                        "host %s: telemetry report failed: %s: %s", s.host_id, exc.code().name, exc.details())
                continue
            self._collector.delivered()
            for why in answer.ignored:
                log.warning("host %s: the controller left telemetry out: %s", s.host_id, why)

    def _queue_exit(self, exit_: TrainerExit) -> None:
        self._pending.append(exit_)
        self._all_sent.clear()
        self._pending_event.set()

    async def _send_last_exits(self) -> None:
        """Leaving a completed job: exits already seen reach the controller first (bounded)."""
        await asyncio.shield(self.supervisor.reconcile())
        try:
            await asyncio.wait_for(self._all_sent.wait(), self.settings.rpc_timeout_s)
        except asyncio.TimeoutError:
            log.warning("host %s: %d exit report(s) not sent before leaving the completed job",
                        self.settings.host_id, len(self._pending))

    # ------------------------------------------------------------------ job state

    def _job_state(self, job_state: int, source: str, reason: str = "") -> None:
        """Act on the job state the controller told (once: COMPLETED and FAILED are final)."""
        end = after_job_state(job_state in (pb.COMPLETED, pb.FAILED), self.settings.on_job_complete)
        if end is JobEnd.RUN or self.job_completed.is_set():
            return
        self.job_completed.set()
        self.job_ending = pb.JobState.Name(job_state)
        s, failed = self.settings, job_state == pb.FAILED
        then = {JobEnd.EXIT: " and exiting", JobEnd.IDLE: "; idling"}.get(end, "; back in the pool")
        if failed or end is JobEnd.POOL:  # a pool agent's next job lays its replicas out afresh
            log.log(logging.ERROR if failed else logging.INFO, "host %s: the job is %s (%s%s): stopping trainers%s",
                    s.host_id, self.job_ending, source, f": {reason}" if reason else "", then)
            self.supervisor.set_wants([])
            if end is JobEnd.EXIT:
                self._quit.set()
            if end is JobEnd.POOL:
                self.assignment, self.version = None, 0
            return
        # COMPLETED: after Manager.close() a trainer's process is the user's (export, evaluation)
        self.supervisor.finish(s.finish_grace_s)
        log.info("host %s: the job is COMPLETED (%s%s): its trainers may finish their own work and exit for up to "
                 "%g s (--finish-grace-s), then they are stopped%s", s.host_id, source,
                 f": {reason}" if reason else "", s.finish_grace_s, then)
        if end is JobEnd.EXIT:
            self._leaving = asyncio.create_task(self._leave_when_finished())

    async def _leave_when_finished(self) -> None:
        """The job COMPLETED: the agent ends once no trainer is finishing (heartbeats go on
        meanwhile, saying how many are)."""
        await self.supervisor.finished()
        self._quit.set()

    def _back_from_pool(self, job_id: str, address: str) -> None:
        """A pool agent whose job ended serves the next one (`policy.serves_next_job`)."""
        log.info("host %s: job %s ended (%s); serving job %s at %s", self.settings.host_id,
                 self.supervisor.job_id or "?", self.job_ending, job_id, address)
        self.job_completed.clear()
        self.job_ending = ""
        self.supervisor.resume()

    def _wants(self, assignment: Assignment | None, effect: Effect) -> list[Want]:
        if self.job_completed.is_set():
            return []  # every slot idle
        s = self.settings
        return orders.wants_for(orders.meet_locally(assignment, *self.ports), effect, s.slot_count, s.standby,
                                self.version)

    # ------------------------------------------------------------------ clean stop

    async def _deregister(self) -> None:
        """Tell the controller this host leaves (bounded: rpc_timeout_s in all, to the last
        controller and the leader it names). Without it the controller notices only after the
        heartbeat timeout; the kept secret then still lets a restarted agent take over."""
        s, address = self.settings, self._address
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.rpc_timeout_s
        for _ in range(2):
            try:
                async with dial.aio_channel(address, s.tls) as channel:
                    await pb_grpc.ControllerStub(channel).DeregisterAgent(pb.DeregisterAgentRequest(
                        host_id=s.host_id, incarnation=self.incarnation, agent_secret=self._secret,
                        reason=self.stop_reason), timeout=max(deadline - loop.time(), 0.01))
            except grpc.aio.AioRpcError as exc:
                hint = dial.leader_hint(exc)
                if hint and hint != address:
                    address = hint
                    continue
                log.warning("host %s could not deregister from %s (%s: %s); the controller notices after the "
                            "heartbeat timeout", s.host_id, address, exc.code().name, exc.details())
                return
            log.info("host %s deregistered from %s: %s", s.host_id, address, self.stop_reason)
            if self._state_path:
                state_file.forget_secret(self._state_path)
            return

    # ------------------------------------------------------------------ orders

    async def handle_order(self, order: pb.Order) -> tuple[bool, str]:
        """Execute one order; (ok, error) for its ack. A repeated order_id is answered again."""
        s = self.settings
        if order.order_id and order.order_id in self._acks:
            return self._acks[order.order_id]
        if self.job_completed.is_set():
            return False, f"the job is COMPLETED: host {s.host_id} starts no trainers"
        kind_name = (pb.Order.Kind.Name(order.kind) if order.kind in pb.Order.Kind.values()
                     else str(order.kind))
        plan = orders.plan_order(order.kind, Assignment.from_proto(order.assignment),
                                 self.assignment, s.slot_count, s.host_id, version=order.version,
                                 current_version=self.version)
        if plan.error:
            log.warning("host %s: order %s %s: %s", s.host_id, order.order_id, kind_name,
                        plan.error)
            result = (False, plan.error)
        else:
            assert plan.effect is not None
            if plan.assignment != self.assignment:
                log.info("host %s: order %s %s: now runs %s (%s)", s.host_id, order.order_id,
                         kind_name, plan.assignment or "nothing (spare)", order.reason)
            else:
                log.info("host %s: order %s %s (%s)", s.host_id, order.order_id, kind_name,
                         order.reason)
            self.assignment, self.version = plan.assignment, plan.version
            if plan.effect is not Effect.KEEP:
                self.supervisor.set_wants(self._wants(plan.assignment, plan.effect))
            elif plan.assignment is not None:  # confirmed under a newer version: running trainers are of it
                self.supervisor.set_wants(self._wants(plan.assignment, Effect.TRAIN))
            if plan.effect is Effect.RESTART:
                self.supervisor.bump()
            if plan.effect in (Effect.RESTART, Effect.TRAIN):
                self.supervisor.resume()
            # Shielded: a broken session must not leave a stop or start half done.
            errors = await asyncio.shield(self.supervisor.reconcile())
            result = (not errors, "; ".join(errors))
        self._acks[order.order_id] = result
        while len(self._acks) > _REMEMBERED_ORDERS:
            self._acks.popitem(last=False)
        return result


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()
