"""The quorum port: leaders' joins and their answers on plain TCP or TLS (protos/quorum_wire.py).

The same join as `QuorumStream` (`ControllerServicer.begin_join`: the job, the certificate
binding, every bound and check of the state), the same shared answer bytes, the same
refusals (by their gRPC code's name, a standby's with the leader's address); a leader that
hangs up while waiting leaves the round as a cancelled stream does. What differs is the cost:
one read and one write per message, no HTTP/2.

Every connection is bounded: at most `max_replica_records` at once (one per leader, with
room for restarts), the preamble and first join within `quorum_port_hello_s` (a stranger
that connects and says nothing is cut off), frames up to `max_request_bytes`, one join at a
time. With TLS on gRPC the port speaks TLS with the same server certificate and client CA
(without an SSL context it is not opened at all, never plain beside a TLS gRPC port). When
the port is refused, full or unreachable, leaders use QuorumStream: nothing depends on it.
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
from protos.quorum_wire import ANSWER, HEADER, JOIN, REFUSED, FrameError, FrameReader, frame

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
        #: answers sent, and refusals by code (the metrics: are leaders on the port, is it under attack?)
        self.answers = 0
        self.refusals: dict[str, int] = {}
        self._listener: asyncio.base_events.Server | None = None

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
    """One leader's connection (or a stranger's, until it proves otherwise)."""

    def __init__(self, port: QuorumPort) -> None:
        self.port = port
        settings = port.server.settings
        self.reader = FrameReader(settings.max_request_bytes, frozenset({JOIN}), preamble=True)
        self.transport: asyncio.Transport | None = None
        self.replica_id: str | None = None
        self.pending: asyncio.Future | None = None
        self._hello: asyncio.TimerHandle | None = None
        self._facts: dict[str, list[bytes]] = {}

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
        limit = self.port.server.settings.max_replica_records
        if len(connections) > limit:
            self._refuse("RESOURCE_EXHAUSTED", f"the quorum port holds {limit} connections, its limit "
                                               f"(max_replica_records); use QuorumStream")
            return
        self._hello = asyncio.get_running_loop().call_later(
            self.port.server.settings.quorum_port_hello_s, self._silent)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            self._refuse("INVALID_ARGUMENT", str(exc))
            return
        for _kind, payload in frames:
            if self.transport.is_closing():
                return
            self._join(payload)

    def eof_received(self) -> bool:
        return False  # the leader is done: close our side too (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.port.connections.discard(self)
        if self._hello is not None:
            self._hello.cancel()
        fut, self.pending = self.pending, None
        if fut is not None and not fut.done():
            fut.cancel()
            self.port.server.forget_waiter(self.replica_id, fut, "its leader's quorum port connection closed")

    # -- joins and answers --------------------------------------------------------------------------

    def _join(self, payload: bytes) -> None:
        if self.pending is not None:
            self._refuse("FAILED_PRECONDITION", "a join arrived before the answer to the last one: send one at a time")
            return
        try:
            request = pb.QuorumRequest.FromString(payload)
        except DecodeError as exc:
            self._refuse("INVALID_ARGUMENT", f"a join of {len(payload)} bytes is not a QuorumRequest: {exc}")
            return
        if self._hello is not None:
            self._hello.cancel()
            self._hello = None
        if self.replica_id is not None and request.replica_id != self.replica_id:
            self._refuse("FAILED_PRECONDITION", f"this connection carries replica {self.replica_id!r}; a join for "
                                                f"{request.replica_id[:64]!r} needs its own connection")
            return
        try:
            fut = self.port.servicer.begin_join(request, self, encoded=True)
        except (RequestError, NotLeader, StoreError) as exc:
            self._refused(exc)
            return
        self.replica_id = request.replica_id
        self.pending = fut
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
        answer: bytes = fut.result()
        self.transport.write(HEADER.pack(len(answer), ANSWER) + answer)
        self.port.answers += 1

    def _refused(self, exc: BaseException) -> None:
        if not isinstance(exc, (RequestError, NotLeader, StoreError)):
            log.error("quorum port: unexpected failure of a join: %r", exc)
        code = grpc_code(exc) if isinstance(exc, Exception) else None
        if isinstance(exc, RequestError):
            log.info("refused a join on the quorum port: %s", exc)
        self._refuse(code.name if code is not None else "INTERNAL", str(exc), getattr(exc, "leader_address", ""))

    def _silent(self) -> None:
        self._hello = None
        self._refuse("DEADLINE_EXCEEDED", f"no join within {self.port.server.settings.quorum_port_hello_s:g}s of "
                                          f"connecting")

    def _refuse(self, code: str, details: str, leader_address: str = "") -> None:
        refusals = self.port.refusals
        refusals[code] = refusals.get(code, 0) + 1
        refusal = pb.QuorumPortRefusal(code=code, details=details[:4096], leader_address=leader_address)
        self.transport.write(frame(REFUSED, refusal.SerializeToString()))
        self.transport.close()


__all__ = ["QuorumPort", "peer_certificate_facts"]
