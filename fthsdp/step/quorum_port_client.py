"""A leader's connection to the controller's quorum port (protos/quorum_wire.py), blocking.

`QuorumPortClient.ask(address, request, timeout_s)` keeps the contract of
`QuorumStream.ask` (and `report` that of the unary `ReportStep`): one round's join, its answer within `timeout_s`, failures as a
`grpc.RpcError` with the code the stream would have given (the port's refusal by its code,
a standby's with its leader hint; DEADLINE_EXCEEDED when no answer came in time;
UNAVAILABLE when the connection failed or ended). After any failure the connection is
closed, and the next ask opens a new one. No threads: the caller's own waits on its
socket, bounded by the deadline. TLS (the CA, the client certificate, the name to check)
comes from the same files as the gRPC channel's.
"""

from __future__ import annotations

import socket
import ssl
import time

import grpc

from fthsdp.step.quorum_stream import StreamFailed
from protos import controller_pb2 as pb
from protos.dial import TlsFiles, parse_addresses
from protos.quorum_wire import ANSWER, JOIN, PREAMBLE, REFUSED, REPORT, REPORTED, FrameError, FrameReader, frame

#: The largest answer accepted: a quorum answer with every member's addresses (the gRPC
#: channel's bound, protos/dial.py channel_options).
MAX_ANSWER_BYTES = 64 << 20
READ_CHUNK = 1 << 16


def client_context(tls: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def resolve(quorum_address: str, grpc_address: str) -> str:
    """Where to reach the quorum port an answer named: ":port" is at the gRPC address's host."""
    if quorum_address.startswith(":"):
        return f"{grpc_address.rpartition(':')[0]}{quorum_address}"
    return quorum_address


class QuorumPortClient:
    def __init__(self, tls: TlsFiles | None = None, max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self._tls = tls if tls is not None and tls.enabled else None
        self._context = client_context(self._tls) if self._tls is not None else None
        self._max_answer_bytes = max_answer_bytes
        self._sock: socket.socket | None = None
        self._address = ""
        self._reader: FrameReader | None = None

    @property
    def open(self) -> bool:
        return self._sock is not None

    def ask(self, address: str, request: pb.QuorumRequest, timeout_s: float) -> pb.QuorumResponse:
        payload = self._exchange(address, JOIN, request, ANSWER, timeout_s, f"quorum answer for step {request.step}")
        return pb.QuorumResponse.FromString(payload)

    def report(self, address: str, request: pb.ReportStepRequest, timeout_s: float) -> pb.ReportStepResponse:
        """A commit report, answered once the controller's store holds it (as ReportStep)."""
        payload = self._exchange(address, REPORT, request, REPORTED, timeout_s,
                                 f"answer to the commit report of step {request.step}")
        return pb.ReportStepResponse.FromString(payload)

    def _exchange(self, address: str, kind: int, request, answer_kind: int, timeout_s: float, what: str) -> bytes:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            if self._sock is None or address != self._address:
                self._connect(address, deadline)
            self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self._sock.sendall(frame(kind, request.SerializeToString()))
            got, payload = self._read(deadline)
            if got not in (answer_kind, REFUSED):
                raise FrameError(f"a frame of kind {got} came where the {what} was due")
        except TimeoutError:
            self.close()
            raise StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED, f"no {what} on the quorum port {address} within "
                                                                  f"{timeout_s:g}s") from None
        except (OSError, FrameError, ValueError) as exc:
            self.close()
            raise StreamFailed(grpc.StatusCode.UNAVAILABLE, f"the quorum port {address} failed: {exc}") from None
        if got == REFUSED:
            self.close()
            refusal = pb.QuorumPortRefusal.FromString(payload)
            code = getattr(grpc.StatusCode, refusal.code, grpc.StatusCode.UNKNOWN)
            raise StreamFailed(code, refusal.details, refusal.leader_address)
        return payload

    def _connect(self, address: str, deadline: float) -> None:
        self.close()
        [address] = parse_addresses(address)  # host:port, or ValueError naming it
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.001))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._tls.server_name or host)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(PREAMBLE)
        except BaseException:
            sock.close()
            raise
        self._sock, self._address = sock, address
        self._reader = FrameReader(self._max_answer_bytes, frozenset({ANSWER, REFUSED, REPORTED}), preamble=False)

    def _read(self, deadline: float) -> tuple[int, bytes]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self._sock.settimeout(left)
            data = self._sock.recv(READ_CHUNK)
            if not data:
                raise ConnectionError("the controller closed the connection")
            frames = self._reader.feed(data)
            if frames:
                if len(frames) > 1:
                    raise FrameError(f"{len(frames)} frames came for one join")
                return frames[0]

    def close(self) -> None:
        sock, self._sock, self._address = self._sock, None, ""
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


__all__ = ["QuorumPortClient", "client_context", "resolve"]
