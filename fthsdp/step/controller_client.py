"""The coordinator's gRPC adapter to the controller: quorum, reports, and the heartbeat stream.

Only the coordinator (on rank 0) uses it. Several controller addresses may be given
("host:port,host:port": a standby taking over). A call that gets UNAVAILABLE -- a dead
controller, a standby that is not the leader -- or DEADLINE_EXCEEDED moves on as
`protos.dial.AddressRotation` says, the rule agents follow too: to the leader a standby
named, else the next address, at once; a pause (doubling, capped) only after a whole pass
without an answer, until the caller's deadline. Errors come out as the runtime's two
kinds (fthsdp/errors.py): ControllerUnavailable (retry later) or ControllerRefused (give
up), plus JobCompleted when a quorum is refused because the job is COMPLETED. The Heartbeat
stream keeps a channel and a rotation of its own, so it finds a new leader even while no call
is made (a long step, the inner steps between semi-synchronous syncs).
TLS comes from FTHSDP_TLS_* (see protos/dial.py), as for the agent that started us.
Quorums and commit reports go to the leader's quorum port once an answer named it
(fthsdp/step/quorum_port_client.py; one connection each), else on gRPC (one long-lived
QuorumStream, unary ReportStep); a port that cannot serve is left for PORT_RETRY_S, and
gRPC, with its failover, takes over.
A controller that does not answer at all -- a wrong address, a controller that is gone -- is
logged once per doubling of the failed attempts (the address and the reason each time), and
after `connect_timeout_s` without a first answer, or `reconnect_timeout_s` once one came
(RuntimeSettings, FTHSDP_CONNECT_TIMEOUT_S / FTHSDP_RECONNECT_TIMEOUT_S; the rule the agent's
--connect-timeout-s / --reconnect-timeout-s follow, `protos.dial.Outage`), the call raises
ControllerUnreachable, a Fatal error: the replica ends non-zero instead of retrying for ever.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Callable, Iterator, TypeVar

import grpc

from fthsdp.errors import (ControllerRefused, ControllerRefusedConfiguration, ControllerUnavailable,
                           ControllerUnreachable, JobCompleted, JobFailed)
from fthsdp.step import coordination as co
from fthsdp.step.leader_credential import leader_credential
from fthsdp.step.quorum_port_client import QuorumPortClient, resolve
from fthsdp.step.quorum_stream import QuorumStream, StreamFailed
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc
from protos.dial import (CONNECT_TIMEOUT_S, ENV_CONNECT_TIMEOUT_S, ENV_RECONNECT_TIMEOUT_S, FAILOVER_CODES,
                         RECONNECT_TIMEOUT_S, AddressRotation, Outage, TlsFiles, leader_hint, parse_addresses,
                         sync_channel)
from protos.job_secret import JobSecret

log = logging.getLogger(__name__)
#: How a refusal because the job is COMPLETED begins (the Manager tells it apart by this).
COMPLETED_PREFIX = "the controller says the job is COMPLETED: "
#: How a refusal of the replica's configuration begins (it reaches every rank as text: the
#: Manager raises ConfigurationError for it).
CONFIGURATION_PREFIX = "the controller refused this replica's configuration: "
#: Refusals of who the replica says it is: its job secret (it differs from the controller's, or
#: there is none), or a request the controller can never take from it.
CONFIGURATION_CODES = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                                 grpc.StatusCode.INVALID_ARGUMENT})
#: FAILED_PRECONDITION refusals of the replica's configuration: a replica id or rank count the
#: job is not configured with (controller.core.admission), another job's id.
CONFIGURATION_REFUSALS = ("configured", "does not match this controller's job")
T = TypeVar("T")

ENV_HOST_ID = "FTHSDP_HOST_ID"  # the agent's name for it (agent/env.py HOST_ID)
REPORT_TIMEOUT_S = 5.0
BACKOFF_BASE_S = 0.05
MAX_BACKOFF_S = 1.0
#: A quorum port that failed is not asked again for this long (the stream serves meanwhile).
PORT_RETRY_S = 60.0
#: What the quorum port answers when it, not the join, is the problem: unreachable, a
#: standby's, full (strangers may fill it), or no answer in time.
PORT_CANNOT_SERVE = FAILOVER_CODES | {grpc.StatusCode.RESOURCE_EXHAUSTED}
class ControllerClient:
    def __init__(self, address: str, job_id: str, replica_id: str, incarnation: str,
                 tls: TlsFiles | None = None, job_secret: JobSecret | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 reconnect_timeout_s: float = RECONNECT_TIMEOUT_S, checkpoint_every_steps: int = 0) -> None:
        self.job_id, self.replica_id, self.incarnation = job_id, replica_id, incarnation
        #: how often this replica writes a durable checkpoint (0: never), told in every join
        self.checkpoint_every_steps = checkpoint_every_steps
        #: set by the agent that started us; the controller fences leaders on replaced hosts
        self.host_id = os.environ.get(ENV_HOST_ID, "")
        #: what every call shows the controller (fthsdp/step/leader_credential.py)
        self.credential = leader_credential(replica_id, self.host_id, job_secret)
        self._controllers = parse_addresses(address)
        self._rotation = AddressRotation(self._controllers, base_s=BACKOFF_BASE_S, cap_s=MAX_BACKOFF_S)
        self._tls = tls if tls is not None else TlsFiles.from_env()
        self._lock = threading.Lock()
        #: calls without any answer since the last answered one (guarded by _lock)
        self._outage = Outage(connect_timeout_s, reconnect_timeout_s)
        self._quorum_stream = QuorumStream()
        self._port = QuorumPortClient(self._tls)
        self._report_port = QuorumPortClient(self._tls)
        #: the leader's quorum port, as its last answer named it ("" : ask on the stream)
        self._port_address = ""
        #: quorum ports that failed -> when: not used again for PORT_RETRY_S
        self._port_failed_at: dict[str, float] = {}
        self._open()
        self._sent_addresses: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        #: where the heartbeat stream goes now (its own failover: _heartbeat_loop), and how many
        #: beats a leader answered
        self.heartbeat_address = self.address
        self.heartbeats_answered = 0
        #: the job state the controller last told us (heartbeat answers, finish reports)
        self.job_state = "RUNNING"

    @property
    def address(self) -> str:
        return self._rotation.current

    def _open(self) -> None:
        self._channel = sync_channel(self.address, self._tls)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    def _failed_over(self, exc: grpc.RpcError) -> float:
        """Move on after a failed call; returns how long to pause first."""
        with self._lock:
            before = self._rotation.index
            pause = self._rotation.failed(leader_hint(exc), jitter=random.random() * 0.5)
            if self._rotation.index != before:
                old = self._channel
                self._open()
                old.close()
        return pause

    def _call(self, name: str, send: Callable[[float], T], timeout_s: float) -> T:
        """`send(attempt_timeout_s)` with failover (see the module docstring), until timeout_s is
        spent (ControllerUnavailable) or no controller answered for connect_timeout_s over all
        calls (ControllerUnreachable)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                answer = send(max(left, 0.01))
                self._rotation.succeeded()
                with self._lock:
                    self._outage.succeeded()
                return answer
            except grpc.RpcError as exc:
                code = exc.code()
                details = exc.details() or ""
                if code not in FAILOVER_CODES:
                    if code is grpc.StatusCode.FAILED_PRECONDITION and " is FAILED: " in details:
                        raise JobFailed(f"the controller says the job is FAILED, so this replica ends: {details}") \
                            from None
                    if code is grpc.StatusCode.FAILED_PRECONDITION and "COMPLETED" in details:
                        raise JobCompleted(f"{COMPLETED_PREFIX}{details}") from None
                    if code in CONFIGURATION_CODES or (code is grpc.StatusCode.FAILED_PRECONDITION and any(
                            phrase in details for phrase in CONFIGURATION_REFUSALS)):
                        raise ControllerRefusedConfiguration(
                            f"{CONFIGURATION_PREFIX}{name} was refused: {code.name}: {details}; a restart changes "
                            f"nothing: fix the configuration, then start the replica again") from None
                    raise ControllerRefused(f"{name} was refused: {code.name}: {details}; fix the settings "
                                            f"or the controller's flags, then restart this replica") from None
                self._sent_addresses = None  # the next controller may not know our addresses
                failed, now = self.address, time.monotonic()
                pause = self._failed_over(exc)
                with self._lock:
                    o = self._outage
                    give_up, say = o.failed(now, pause), o.worth_a_line
                    attempts, outage_s, limit_s, again = o.attempts, o.length(now), o.limit_s, o.answered
                setting = ("reconnect_timeout_s", ENV_RECONNECT_TIMEOUT_S) if again else \
                    ("connect_timeout_s", ENV_CONNECT_TIMEOUT_S)
                if give_up:
                    raise ControllerUnreachable(
                        f"replica {self.replica_id}: no controller answered for {outage_s:.1f} s ({attempts} "
                        f"attempt(s), last {failed}: {code.name}: {details}); giving up ({setting[0]} "
                        f"{limit_s:g}, {setting[1]}). Check the controller address "
                        f"({', '.join(self._controllers)}) and that the controller runs") from None
                if now >= deadline:
                    raise ControllerUnavailable(f"{name} got no answer within {timeout_s:g}s from "
                                                f"{', '.join(self._controllers)}: last {code.name}: "
                                                f"{details}") from None
                if say:  # once per doubling of the attempts: a wrong address shows at once, then seldom
                    log.warning("replica %s: controller %s failed %s (%s: %s), attempt %d; trying %s in %.2f s "
                                "(giving up after %g s without an answer, %s)", self.replica_id, failed, name,
                                code.name, details, attempts, self.address, pause, limit_s, setting[1])
                if pause:
                    self._stop.wait(min(pause, max(deadline - time.monotonic(), 0.0)))

    def quorum(self, request: co.RequestQuorum, world_size: int, coordinator_address: str,
               timeout_s: float) -> pb.QuorumResponse:
        """The controller's answer as it came (members' addresses may be left out)."""
        mine = (request.ftar_addresses, request.state_addresses)

        def send(attempt_timeout_s: float) -> pb.QuorumResponse:
            deadline = time.monotonic() + attempt_timeout_s
            addresses = mine if mine != self._sent_addresses else ((), ())
            join = pb.QuorumRequest(
                job_id=self.job_id, replica_id=self.replica_id, step=request.step, world_size=world_size,
                ftar_addresses=list(addresses[0]), state_addresses=list(addresses[1]),
                known_quorum_id=request.known_quorum_id, leader_address=coordinator_address,
                incarnation=self.incarnation, host_id=self.host_id, credential=self.credential,
                checkpoint_every_steps=self.checkpoint_every_steps)
            # On the leader's quorum port once an answer named it; else (and when the port is
            # unreachable, full or a standby's) on the one long-lived QuorumStream, whose
            # failed or unanswered ask closes it, and the next opens a new one on whichever
            # controller the rotation chose.
            answer = self._on_port("Quorum", lambda port: self._port.ask(port, join, attempt_timeout_s))
            if answer is not None:
                self._quorum_stream.close(goodbye=True)  # idle from now on
            else:
                answer = self._quorum_stream.ask(self._stub, join, max(deadline - time.monotonic(), 0.01))
            self._learn_port(answer.quorum_address)
            self._sent_addresses = mine
            return answer

        return self._call("Quorum", send, timeout_s)

    def _on_port(self, what: str, call: Callable[[str], T]) -> T | None:
        """`call(port address)`'s answer, or None when there is no quorum port to ask (or it
        failed in a way gRPC may not: refused as full, unreachable, a standby's)."""
        address = self._port_address
        if not address:
            return None
        try:
            return call(address)
        except StreamFailed as exc:
            if exc.code() not in PORT_CANNOT_SERVE:
                raise  # a refusal of the request itself: gRPC would refuse it alike
            log.info("replica %s: quorum port %s: %s: %s; sending %s on gRPC", self.replica_id, address,
                     exc.code().name, exc.details(), what)
            self._port_address = ""
            self._port_failed_at[address] = time.monotonic()
            if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise  # the attempt's time is spent
            return None

    def _learn_port(self, named: str) -> None:
        address = resolve(named, self.address) if named else ""
        failed = self._port_failed_at.get(address)
        if failed is not None and time.monotonic() - failed < PORT_RETRY_S:
            return
        self._port_failed_at.pop(address, None)
        if address and address != self._port_address:
            log.info("replica %s: quorums go to the quorum port %s", self.replica_id, address)
        self._port_address = address

    def report_step(self, r: co.ReportStep) -> None:
        request = pb.ReportStepRequest(
            job_id=self.job_id, replica_id=self.replica_id, quorum_id=r.quorum_id, step=r.step,
            step_time_s=r.step_time_s, loss=r.loss, tokens=r.tokens, host_id=self.host_id, digest=r.digest,
            credential=self.credential,
            caught_up=r.caught_up, rank_digests=list(r.rank_digests), checkpoint_step=r.checkpoint_step)

        def send(attempt_timeout_s: float) -> pb.ReportStepResponse:
            # On the quorum port's second connection (reports come from another thread than
            # quorums) once an answer named it; else, or when it cannot serve, on gRPC.
            answer = self._on_port("ReportStep", lambda port: self._report_port.report(port, request, attempt_timeout_s))
            return answer if answer is not None else self._stub.ReportStep(request, timeout=attempt_timeout_s)

        self._call("ReportStep", send, REPORT_TIMEOUT_S)

    def report_failure(self, r: co.ReportFailure) -> None:
        kind = pb.ReportFailureRequest.REPLICA_DEAD if r.dead else pb.ReportFailureRequest.COMMIT_FAILED
        request = pb.ReportFailureRequest(job_id=self.job_id, replica_id=self.replica_id, quorum_id=r.quorum_id,
                                          step=r.step, kind=kind, reason=r.reason[:1000], host_id=self.host_id,
                                          credential=self.credential)
        self._call("ReportFailure", lambda t: self._stub.ReportFailure(request, timeout=t), REPORT_TIMEOUT_S)

    def report_finished(self, r: co.ReportFinished) -> str:
        """Returns the job state the controller answered with."""
        request = pb.ReportFinishedRequest(job_id=self.job_id, replica_id=self.replica_id, step=r.step,
                                           host_id=self.host_id, reason=r.reason[:1000], credential=self.credential)
        answer = self._call("ReportFinished", lambda t: self._stub.ReportFinished(request, timeout=t),
                            REPORT_TIMEOUT_S)
        self.job_state = pb.JobState.Name(answer.job_state)
        return self.job_state

    def start_heartbeats(self, interval_s: float) -> None:
        """Keep one Heartbeat stream open on a background thread, reconnecting when it breaks."""
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, args=(interval_s,),
                                                  name=f"heartbeat-{self.replica_id}", daemon=True)
        self._heartbeat_thread.start()

    def _beats(self, interval_s: float) -> Iterator[pb.HeartbeatRequest]:
        while not self._stop.is_set():
            yield pb.HeartbeatRequest(replica_ids=[self.replica_id], credential=self.credential,
                                      host_id=self.host_id)
            self._stop.wait(interval_s)

    def _heartbeat_loop(self, interval_s: float) -> None:
        """The Heartbeat stream on a channel of its own, with its own failover: it starts where the
        calls are and, when the stream breaks or a standby answers, moves on as AddressRotation
        says (to the leader a standby named, else the next address). It never waits for a call
        to fail over first: a replica that has nothing to ask (a long step, inner steps between
        syncs) must still reach a new leader before its heartbeat times out there."""
        rotation = AddressRotation(self._controllers, base_s=BACKOFF_BASE_S, cap_s=MAX_BACKOFF_S)
        rotation.index = self._rotation.index
        channel = None
        try:
            while not self._stop.is_set():
                if channel is None:
                    channel = sync_channel(rotation.current, self._tls)
                    stub = controller_pb2_grpc.ControllerStub(channel)
                    self.heartbeat_address = rotation.current
                hint = ""
                try:
                    for answer in stub.Heartbeat(self._beats(interval_s)):
                        if answer.not_leader:
                            hint = answer.leader_address
                            break  # a standby: the leader it names, else the next address
                        rotation.succeeded()
                        self.heartbeats_answered += 1
                        if answer.job_state:
                            self.job_state = pb.JobState.Name(answer.job_state)
                        if self.replica_id in answer.unknown_ids:
                            # normal before its first join (every start): not worth a line
                            log.debug("replica %s: controller does not know this replica yet", self.replica_id)
                except grpc.RpcError as exc:
                    hint = leader_hint(exc)
                    if not self._stop.is_set():
                        log.info("replica %s: heartbeat stream to %s broke (%s); moving on", self.replica_id,
                                 rotation.current, exc.code().name)
                if self._stop.is_set():
                    break
                before = rotation.index
                pause = rotation.failed(hint, jitter=random.random() * 0.5)
                if rotation.index != before:
                    channel.close()
                    channel = None
                self._stop.wait(pause)
        finally:
            if channel is not None:
                channel.close()

    def close(self) -> None:
        self._stop.set()
        self._quorum_stream.close(goodbye=True)
        self._port.close()
        self._report_port.close()
        self._channel.close()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(5.0)
