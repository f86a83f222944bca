"""The quorum port: coordinators' joins, commit reports and their answers on plain TCP or TLS
(protos/quorum_wire.py).

The same join as `QuorumStream` (`ControllerServicer.begin_join`: the job, the certificate
binding, every bound and check of the state), the same shared answer bytes, the same
refusals (by their gRPC code's name, a standby's with the leader's address); a coordinator
that hangs up while waiting leaves the round as a cancelled stream does. A commit report takes
the path of `Controller.ReportStep` (`ControllerServicer.report_step`) and is answered once
the store holds it. What differs is the cost: one read and one write per message, no HTTP/2.

Every connection is bounded: at most 2 x `max_replica_records` at once (a coordinator's
two, with room for restarts), the preamble and first message within `quorum_port_hello_s` (a
stranger that connects and says nothing is cut off), frames up to `max_request_bytes`, one
message at a time, one replica; once a frame has begun, the rest of it within
`quorum_port_frame_s` (a connection that joined cannot then trickle a frame forever), and the
bytes of unfinished frames over all connections under `quorum_port_buffer_bytes`, whatever the
job's size (a connection that would pass it is refused with RESOURCE_EXHAUSTED). With TLS on gRPC the port speaks TLS with the same server
certificate and client CA (without an SSL context it is not opened at all, never plain
beside a TLS gRPC port). When the port is refused, full or unreachable, coordinators use gRPC:
nothing depends on it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl

from google.protobuf.message import DecodeError

from controller.core.errors import RequestError
from controller.service.errors import NotLeader, grpc_code
from controller.store import StoreError
from protos import controller_pb2 as pb
from protos.quorum_wire import ANSWER, JOIN, REFUSED, REPORT, REPORTED, FrameError, FrameReader, frame

log = logging.getLogger("fthsdp.controller")


def peer_certificate_facts(peercert: dict | None) -> dict[str, list[bytes]]:
    """A verified client certificate (`SSLSocket.getpeercert()`) as a gRPC call's
    `auth_context()` lists it: SAN DNS names, SAN URIs, subject CN."""
    facts: dict[str, list[bytes]] = {"peer_dns": [], "peer_uri": [], "x509_common_name": []}
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        key = {"DNS": "peer_dns", "URI": "peer_uri"}.get(kind)
        if key:
            facts[key].append(value.encode())
    for rdn in (peercert or {}).get("subject", ()):
        facts["x509_common_name"] += [value.encode() for name, value in rdn if name == "commonName"]
    return {k: v for k, v in facts.items() if v}


class QuorumPort:
    def __init__(self, server, servicer, ssl_context: ssl.SSLContext | None) -> None:
        self.server, self.servicer, self.ssl_context = server, servicer, ssl_context
        self.connections: set[_Connection] = set()
        #: answers sent, and refusals by code (the metrics: are coordinators on the port, is it under attack?)
        self.answers = self.reports = 0
        self.refusals: dict[str, int] = {}
        #: bytes of unfinished frames held by all connections (bounded: quorum_port_buffer_bytes)
        self.buffered = 0
        self._listener: asyncio.base_events.Server | None = None

    @property
    def max_connections(self) -> int:
        """Two per replica record: a coordinator's joins and its commit reports."""
        return 2 * self.server.settings.max_replica_records

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port bound."""
        hello_s = self.server.settings.quorum_port_hello_s
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), host, port, ssl=self.ssl_context, reuse_address=True,
            ssl_handshake_timeout=hello_s if self.ssl_context is not None else None)
        return self._listener.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        if self._listener is None:
            return
        self._listener.close()
        for connection in list(self.connections):
            connection.transport.abort()
        try:
            await asyncio.wait_for(self._listener.wait_closed(), grace_s)
        except asyncio.TimeoutError:
            log.warning("the quorum port did not close within %gs", grace_s)


class _Connection(asyncio.Protocol):
    """One coordinator's connection (or a stranger's, until it proves otherwise)."""

    def __init__(self, port: QuorumPort) -> None:
        self.port = port
        settings = port.server.settings
        self.reader = FrameReader(settings.max_request_bytes, frozenset({JOIN, REPORT}), preamble=True)
        self.transport: asyncio.Transport | None = None
        self.replica_id: str | None = None
        #: the join's future or the report's task this connection waits on, and which it is
        self.pending: asyncio.Future | None = None
        self.pending_join = False
        self._hello: asyncio.TimerHandle | None = None
        #: the deadline of the frame begun and not yet complete (None between frames)
        self._frame: asyncio.TimerHandle | None = None
        #: this connection's share of port.buffered
        self._held = 0
        self._facts: dict[str, list[bytes]] = {}
        #: this side closed the connection (a refusal): its end is no sign of the coordinator's death
        self.closed_here = False

    # -- what begin_join asks of a gRPC call ----------------------------------------------------

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._facts

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        connections = self.port.connections
        connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._facts = peer_certificate_facts(transport.get_extra_info("peercert"))
        limit = self.port.max_connections
        if len(connections) > limit:
            self._refuse("RESOURCE_EXHAUSTED", f"the quorum port holds {limit} connections, its limit "
                                               f"(2 x max_replica_records); use gRPC")
            return
        self._hello = asyncio.get_running_loop().call_later(
            self.port.server.settings.quorum_port_hello_s, self._silent)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        limit = self.port.server.settings.quorum_port_buffer_bytes
        if self.port.buffered + len(data) > limit:  # (this connection's own bytes are in port.buffered)
            self._refuse("RESOURCE_EXHAUSTED", f"the quorum port holds {self.port.buffered} bytes of unfinished frames; "
                                               f"{len(data)} more would pass its limit of {limit} "
                                               f"(quorum_port_buffer_bytes); use gRPC")
            return
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            self._refuse("INVALID_ARGUMENT", str(exc))
            return
        self._hold(self.reader.buffered)
        for kind, payload in frames:
            if self.transport.is_closing():
                return
            if self.pending is not None:
                self._refuse("FAILED_PRECONDITION", "a message arrived before the answer to the last one: send one "
                                                    "at a time")
                return
            if kind == JOIN:
                self._join(payload)
            else:
                self._report(payload)
        self._arm(bool(frames))

    def eof_received(self) -> bool:
        return False  # the coordinator is done: close our side too (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.port.connections.discard(self)
        if self._hello is not None:
            self._hello.cancel()
        self._hold(0)
        self._arm(True)
        fut, self.pending = self.pending, None
        if fut is not None and not fut.done():
            fut.cancel()  # a report's state change stands: its store write goes on, shielded
            if self.pending_join:
                self.port.server.forget_waiter(self.replica_id, fut, "its coordinator's quorum port connection closed")
        if self.replica_id is not None and not self.closed_here:
            self.port.server.coordinator_connection_lost(self.replica_id, "its coordinator's quorum port connection")

    # -- joins and answers --------------------------------------------------------------------------

    def _decode(self, message, payload: bytes, what: str):
        """The message, from the coordinator of this connection's replica (None: refused)."""
        try:
            request = message.FromString(payload)
        except DecodeError as exc:
            self._refuse("INVALID_ARGUMENT", f"a {what} of {len(payload)} bytes is not a {message.__name__}: {exc}")
            return None
        if self._hello is not None:
            self._hello.cancel()
            self._hello = None
        if self.replica_id is not None and request.replica_id != self.replica_id:
            self._refuse("FAILED_PRECONDITION", f"this connection carries replica {self.replica_id!r}; a {what} for "
                                                f"{request.replica_id[:64]!r} needs its own connection")
            return None
        return request

    def _join(self, payload: bytes) -> None:
        request = self._decode(pb.QuorumRequest, payload, "join")
        if request is None:
            return
        try:
            fut = self.port.servicer.begin_join(request, self, encoded=True)
        except (RequestError, NotLeader, StoreError) as exc:
            self._refused(exc)
            return
        self._wait(request.replica_id, fut, join=True)

    def _report(self, payload: bytes) -> None:
        request = self._decode(pb.ReportStepRequest, payload, "commit report")
        if request is not None:
            self._wait(request.replica_id, asyncio.ensure_future(self.port.servicer.report_step(request, self)),
                       join=False)

    def _wait(self, replica_id: str, fut: asyncio.Future, join: bool) -> None:
        self.replica_id, self.pending, self.pending_join = replica_id, fut, join
        fut.add_done_callback(self._answered)

    def _answered(self, fut: asyncio.Future) -> None:
        if fut is not self.pending:
            return  # cancelled by connection_lost
        self.pending = None
        if self.transport.is_closing():
            return
        exc = fut.exception()
        if exc is not None:
            self._refused(exc)
            return
        if self.pending_join:
            self.transport.write(frame(ANSWER, fut.result()))  # the round's shared bytes
            self.port.answers += 1
        else:
            self.transport.write(frame(REPORTED, fut.result().SerializeToString()))
            self.port.reports += 1

    def _refused(self, exc: BaseException) -> None:
        code = grpc_code(exc) if isinstance(exc, Exception) else None
        if code is None:
            log.error("quorum port: unexpected failure of a %s: %r", "join" if self.pending_join else "report", exc)
        elif isinstance(exc, RequestError):
            log.info("refused on the quorum port: %s", exc)
        self._refuse(code.name if code is not None else "INTERNAL", str(exc), getattr(exc, "leader_address", ""))

    def _hold(self, buffered: int) -> None:
        """Account for the bytes of unfinished frames this connection now holds."""
        self.port.buffered += buffered - self._held
        self._held = buffered

    def _arm(self, completed: bool) -> None:
        """A frame begun gets its deadline, from its first byte (a completed frame ends the
        last one's); before the first message the hello deadline bounds it instead."""
        if self._frame is not None and (completed or not self._held):
            self._frame.cancel()
            self._frame = None
        if self._held and self._frame is None and self._hello is None and not self.transport.is_closing():
            self._frame = asyncio.get_running_loop().call_later(self.port.server.settings.quorum_port_frame_s,
                                                                self._slow)

    def _slow(self) -> None:
        self._frame = None
        self._refuse("DEADLINE_EXCEEDED", f"a frame begun {self.port.server.settings.quorum_port_frame_s:g}s ago is "
                                          f"not complete ({self.reader.buffered} bytes so far)")

    def _silent(self) -> None:
        self._hello = None
        self._refuse("DEADLINE_EXCEEDED", f"no join within {self.port.server.settings.quorum_port_hello_s:g}s of "
                                          f"connecting")

    def _refuse(self, code: str, details: str, leader_address: str = "") -> None:
        refusals = self.port.refusals
        refusals[code] = refusals.get(code, 0) + 1
        refusal = pb.QuorumPortRefusal(code=code, details=details[:4096], leader_address=leader_address)
        self.transport.write(frame(REFUSED, refusal.SerializeToString()))
        self.closed_here = True
        self.transport.close()


__all__ = ["QuorumPort", "peer_certificate_facts"]
