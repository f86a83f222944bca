"""The leader's gRPC adapter to the controller: quorum, reports, and the heartbeat stream.

Only rank 0 of a replica uses it. It converts answers into the runtime's plain
`QuorumView`, remembers members' addresses so the controller may leave them out,
retries an unreachable controller until the caller's deadline (moving to the next
address when several are given: "host:port,host:port", for a standby taking over), and
keeps a heartbeat stream open on one background thread (started by `start_heartbeats`).
TLS comes from FTHSDP_TLS_* (see protos/dial.py), as for the agent that started us.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterator

import grpc

from fthsdp.step_plan import MemberView, QuorumView
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc
from protos.dial import TlsFiles, parse_addresses, sync_channel

log = logging.getLogger(__name__)

ENV_HOST_ID = "FTHSDP_HOST_ID"  # the agent's name for it (agent/env.py HOST_ID)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
REPORT_TIMEOUT_S = 5.0


class ControllerError(Exception):
    """The controller refused a request or stayed unreachable past the deadline."""


class ControllerClient:
    def __init__(self, address: str, job_id: str, replica_id: str, incarnation: str,
                 tls: TlsFiles | None = None) -> None:
        self.job_id, self.replica_id, self.incarnation = job_id, replica_id, incarnation
        #: set by the agent that started us; the controller fences leaders on replaced hosts
        self.host_id = os.environ.get(ENV_HOST_ID, "")
        self._controllers = parse_addresses(address)
        self._tls = tls if tls is not None else TlsFiles.from_env()
        self._index = 0
        self._open()
        self._known_quorum_id = 0
        self._addresses: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._sent_addresses: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self._controllers[self._index]

    def _open(self) -> None:
        self._channel = sync_channel(self.address, self._tls)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    def _next_controller(self) -> None:
        """Move to the next controller address (a no-op reconnect when there is one)."""
        old = self._channel
        self._index = (self._index + 1) % len(self._controllers)
        self._open()
        old.close()

    def quorum(self, step: int, world_size: int, ftar_addresses: list[str], state_addresses: list[str],
               leader_address: str, timeout_s: float) -> QuorumView:
        mine = (tuple(ftar_addresses), tuple(state_addresses))
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            send = mine if mine != self._sent_addresses else ((), ())
            request = pb.QuorumRequest(
                job_id=self.job_id, replica_id=self.replica_id, step=step, world_size=world_size,
                ftar_addresses=list(send[0]), state_addresses=list(send[1]),
                known_quorum_id=self._known_quorum_id, leader_address=leader_address,
                incarnation=self.incarnation, host_id=self.host_id)
            left = deadline - time.monotonic()
            try:
                answer = self._stub.Quorum(request, timeout=max(left, 0.01))
                self._sent_addresses = mine
                return self._to_view(answer, step)
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in RETRYABLE or time.monotonic() + delay >= deadline:
                    raise ControllerError(f"quorum for step {step} failed: {code.name}: {exc.details()}") from exc
                log.info("replica %s: controller at %s unavailable (%s), retrying", self.replica_id,
                         self.address, code.name)
                self._sent_addresses = None  # the controller may have restarted and forgotten them
                if len(self._controllers) > 1:
                    self._next_controller()
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _to_view(self, answer: pb.QuorumResponse, step: int) -> QuorumView:
        members = []
        for m in answer.members:
            if answer.addresses_included:
                self._addresses[m.replica_id] = (tuple(m.ftar_addresses), tuple(m.state_addresses))
            ftar, state = self._addresses.get(m.replica_id, ((), ()))
            if not ftar:
                self._known_quorum_id = 0
                raise ControllerError(f"quorum {answer.quorum_id} left out the addresses of {m.replica_id}, "
                                      f"which this leader never received")
            members.append(MemberView(m.replica_id, m.step, m.healthy, ftar, state))
        self._known_quorum_id = answer.quorum_id
        return QuorumView(
            quorum_id=answer.quorum_id, step=step, max_step=answer.max_step, members=tuple(members),
            recover={r.replica_id: tuple(r.sources_by_shard) for r in answer.recover},
            lr_scale=answer.lr_scale, total_replicas=answer.total_replicas, reason=answer.reason)

    def report_step(self, quorum_id: int, step: int, step_time_s: float, loss: float, tokens: int) -> None:
        self._best_effort("ReportStep", self._stub.ReportStep, pb.ReportStepRequest(
            job_id=self.job_id, replica_id=self.replica_id, quorum_id=quorum_id, step=step,
            step_time_s=step_time_s, loss=loss, tokens=tokens, host_id=self.host_id))

    def report_failure(self, quorum_id: int, step: int, reason: str, dead: bool = False) -> None:
        kind = pb.ReportFailureRequest.REPLICA_DEAD if dead else pb.ReportFailureRequest.COMMIT_FAILED
        self._best_effort("ReportFailure", self._stub.ReportFailure, pb.ReportFailureRequest(
            job_id=self.job_id, replica_id=self.replica_id, quorum_id=quorum_id, step=step,
            kind=kind, reason=reason[:1000]))

    def _best_effort(self, name: str, call, request) -> None:
        try:
            call(request, timeout=REPORT_TIMEOUT_S)
        except grpc.RpcError as exc:
            log.warning("replica %s: %s to the controller failed: %s", self.replica_id, name, exc.code().name)

    def start_heartbeats(self, interval_s: float) -> None:
        """Keep one Heartbeat stream open on a background thread, reconnecting when it breaks."""
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, args=(interval_s,),
                                                  name=f"heartbeat-{self.replica_id}", daemon=True)
        self._heartbeat_thread.start()

    def _beats(self, interval_s: float) -> Iterator[pb.HeartbeatRequest]:
        while not self._stop.is_set():
            yield pb.HeartbeatRequest(replica_ids=[self.replica_id])
            self._stop.wait(interval_s)

    def _heartbeat_loop(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                for answer in self._stub.Heartbeat(self._beats(interval_s)):
                    if self.replica_id in answer.unknown_ids:
                        log.info("replica %s: controller does not know this replica yet", self.replica_id)
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    log.info("replica %s: heartbeat stream broke (%s); reconnecting", self.replica_id,
                             exc.code().name)
            self._stop.wait(interval_s)

    def close(self) -> None:
        self._stop.set()
        self._channel.close()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(5.0)
