"""One peer's TCP connection to a server that authenticates hellos: the replica's coordinator
(fthsdp/step/coordinator.py) or a relay (fthsdp/step/relay.py).

Frames are parsed as bytes arrive (no task or future per message), which is what lets one
thread serve thousands of peers. The connection gets a challenge at once; until the server
admits it (its hello authenticated and bound), everything it sends goes to the server's
`_hello`, at most MAX_HELLO_FRAME_BYTES a frame, and it is closed when it has not been
admitted within hello_timeout_s. A peer that stops reading its frames is cut off once
MAX_PENDING_WRITE_BYTES wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Protocol

from fthsdp.step.messages import MAX_COORDINATOR_FRAME_BYTES, MAX_HELLO_FRAME_BYTES, FrameReader, MessageError, frame
from ftar_kernels import auth
from protos import replica_pb2 as rpb

log = logging.getLogger(__name__)
#: frames waiting for a peer that does not read them, before it is cut off
MAX_PENDING_WRITE_BYTES = 4 * MAX_COORDINATOR_FRAME_BYTES

Decoder = Callable[[bytes], tuple[str, object]]


class HelloServer(Protocol):
    """What a PeerConnection needs of its server."""

    hello_timeout_s: float
    name: str

    def _connected(self, conn: "PeerConnection") -> tuple[int, bool]: ...
    def _hello(self, conn: "PeerConnection", kind: str, message) -> None: ...
    def _received(self, conn: "PeerConnection", kind: str, message) -> None: ...
    def _disconnected(self, conn: "PeerConnection", reason: str) -> None: ...


class PeerConnection(asyncio.Protocol):
    def __init__(self, server: HelloServer, decode_hello: Decoder) -> None:
        self.server = server
        self.conn_id = 0
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.reader = FrameReader(MAX_HELLO_FRAME_BYTES)
        self.decode = decode_hello
        self.challenge = b""
        self.authenticated = False
        self.refused = False
        #: what the server bound this connection to (a rank, a relay's group)
        self.bound: object = None
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conn_id, admitted = self.server._connected(self)
        if not admitted:
            self.refuse("too many connections are saying hello at once; try again", retry=True)
            return
        self.challenge = auth.nonce()
        self.transport.write(frame(rpb.CoordinatorFrame(challenge=rpb.Challenge(nonce=self.challenge))))
        # A connection that does not authenticate in time is not kept: every input has a bound.
        self._hello_timer = asyncio.get_running_loop().call_later(self.server.hello_timeout_s, self._hello_due)

    def admit(self, limit: int, decode: Decoder, bound: object) -> None:
        """The hello was authenticated and bound: from now on frames up to `limit`, parsed by `decode`."""
        self.authenticated, self.bound = True, bound
        self.reader.limit, self.decode = limit, decode
        if self._hello_timer is not None:
            self._hello_timer.cancel()

    def _hello_due(self) -> None:
        if not self.authenticated and not self.transport.is_closing():
            self.refuse(f"no authenticated hello within {self.server.hello_timeout_s:g}s")

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        try:
            for body in self.reader.feed(data):
                kind, message = self.decode(body)
                if self.authenticated:
                    self.server._received(self, kind, message)
                else:
                    self.server._hello(self, kind, message)
                if self.refused:
                    return
        except MessageError as exc:
            self.refuse(str(exc))

    def write(self, data: bytes) -> None:
        """Send a frame; a peer that lets too many pile up unread is cut off."""
        if self.transport.is_closing():
            return
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > MAX_PENDING_WRITE_BYTES:
            log.warning("%s: cutting off connection %s: %d bytes of frames wait unread", self.server.name,
                        self.conn_id, self.transport.get_write_buffer_size())
            self.refused = True
            self.transport.abort()

    def refuse(self, reason: str, retry: bool = False) -> None:
        if not self.refused:
            self.refused = True
            self.transport.write(frame(rpb.CoordinatorFrame(refusal=rpb.Refusal(reason=reason[:1000], retry=retry))))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        reason = "refused" if self.refused else (repr(exc) if exc else "closed the connection")
        self.server._disconnected(self, reason)
