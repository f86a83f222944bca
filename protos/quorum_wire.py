"""The quorum port's framing: a leader's join and the controller's answer without HTTP/2.

The quorum port carries exactly what `Controller.QuorumStream` carries -- a leader's
`QuorumRequest` per step, the controller's `QuorumResponse` once the round closes -- on a
plain TCP connection (TLS when the controller's gRPC port has TLS, with the same client
certificates). At 8-16 leaders most of a round's cost on both sides was gRPC's own
(HTTP/2 framing and its wake-ups, several syscalls per message); here a message is one
write and one read.

A connection starts with the client's PREAMBLE (the protocol and its version), then frames:
a header -- payload length (uint32, big-endian) and kind (uint8) -- and the payload.

- leader -> controller: JOIN, a serialized QuorumRequest, or REPORT, a serialized
  ReportStepRequest (a commit report, as Controller.ReportStep takes it); one at a time (the
  next only after the answer to the last: a message sent early is refused).
- controller -> leader: ANSWER, a serialized QuorumResponse (to a JOIN), REPORTED, a
  serialized ReportStepResponse (to a REPORT, once the store holds it); or REFUSED, a
  QuorumPortRefusal (the gRPC status code the same refusal has on gRPC, its message, a
  standby's leader hint), after which the controller closes the connection.

Every length is checked against the reader's bound before the payload is read.
"""

from __future__ import annotations

import struct

PREAMBLE = b"FTHSDPQ1"
HEADER = struct.Struct(">IB")
JOIN = 1
REPORT = 3
ANSWER = 1
REFUSED = 2
REPORTED = 3


class FrameError(ValueError):
    """The bytes on a quorum port connection break the framing: the connection must end."""


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind) + payload


class FrameReader:
    """Frames out of a byte stream, fed as it arrives. Holds at most one frame's bytes
    (header + `max_payload_bytes`) plus what one read brought."""

    def __init__(self, max_payload_bytes: int, kinds: frozenset[int], preamble: bool) -> None:
        self.max_payload_bytes, self.kinds = max_payload_bytes, kinds
        self._want_preamble = preamble
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete (0 between frames)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The frames `data` completes, in order. Raises FrameError naming the bad value."""
        self._buffer += data
        if self._want_preamble:
            if len(self._buffer) < len(PREAMBLE):
                if not PREAMBLE.startswith(bytes(self._buffer)):
                    raise FrameError(f"the connection did not start with the quorum port's preamble {PREAMBLE!r} "
                                     f"(got {bytes(self._buffer)!r})")
                return []
            if self._buffer[:len(PREAMBLE)] != PREAMBLE:
                raise FrameError(f"the connection did not start with the quorum port's preamble {PREAMBLE!r} "
                                 f"(got {bytes(self._buffer[:len(PREAMBLE)])!r})")
            del self._buffer[:len(PREAMBLE)]
            self._want_preamble = False
        frames = []
        while len(self._buffer) >= HEADER.size:
            length, kind = HEADER.unpack_from(self._buffer)
            if kind not in self.kinds:
                raise FrameError(f"frame kind {kind} is not one of {sorted(self.kinds)}")
            if length > self.max_payload_bytes:
                raise FrameError(f"a frame of {length} bytes is over the limit of {self.max_payload_bytes}")
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append((kind, bytes(self._buffer[HEADER.size:end])))
            del self._buffer[:end]
        return frames


__all__ = ["ANSWER", "FrameError", "FrameReader", "HEADER", "JOIN", "PREAMBLE", "REFUSED", "REPORT", "REPORTED",
           "frame"]
