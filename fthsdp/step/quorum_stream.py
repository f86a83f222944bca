"""A leader's one long-lived `Controller.QuorumStream`, used from blocking code.

`QuorumStream.ask(stub, request, timeout_s)` sends one round's join on the stream and waits,
bounded, for its answer: the same contract as the unary `stub.Quorum(request, timeout=...)`,
without a call set-up per step (the controller's cost per leader and step is about half).
A failure comes out as a `grpc.RpcError` with its code, as the unary call's would: the
stream's own status (a refusal, a standby's UNAVAILABLE with its leader hint), or
DEADLINE_EXCEEDED when no answer came in time. Either way the stream is closed, and the
next `ask` opens a new one -- on the stub it is given, so a caller that failed over to
another controller passes that one's stub.

One thread per open stream reads its answers (grpc's blocking iterator cannot wait with a
timeout); grpc itself runs another that feeds it requests.
"""

from __future__ import annotations

import queue
import threading

import grpc

from protos import controller_pb2 as pb
from protos.dial import LEADER_METADATA_KEY

_END = None  # what the request iterator yields to end the stream
#: how long a goodbye waits for the controller to end the stream before it is cancelled
GOODBYE_S = 1.0


class StreamFailed(grpc.RpcError):
    """A failure the stream (or the quorum port) noticed itself: no answer in time, an end
    without one, or the port's refusal (its code, message and leader hint)."""

    def __init__(self, code: grpc.StatusCode, details: str, leader_address: str = "") -> None:
        super().__init__(details)
        self._code, self._details, self._leader = code, details, leader_address

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return ((LEADER_METADATA_KEY, self._leader),) if self._leader else ()


class QuorumStream:
    def __init__(self) -> None:
        self._stub = None
        self._call = None
        self._requests: queue.Queue | None = None
        self._answers: queue.Queue | None = None
        self._reader: threading.Thread | None = None

    @property
    def open(self) -> bool:
        return self._call is not None

    def ask(self, stub, request: pb.QuorumRequest, timeout_s: float) -> pb.QuorumResponse:
        if self._call is None or stub is not self._stub:
            self._open(stub)
        answers = self._answers
        self._requests.put(request)
        try:
            got = answers.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            self.close()
            raise StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"no quorum answer for step {request.step} within {timeout_s:g}s") from None
        if isinstance(got, grpc.RpcError):
            self.close()
            raise got
        return got

    def _open(self, stub) -> None:
        self.close()
        requests: queue.Queue = queue.Queue()
        answers: queue.Queue = queue.Queue()
        call = stub.QuorumStream(iter(requests.get, _END))

        def read() -> None:
            try:
                for answer in call:
                    answers.put(answer)
                answers.put(StreamFailed(grpc.StatusCode.UNAVAILABLE, "the controller ended the quorum stream"))
            except grpc.RpcError as exc:
                answers.put(exc)

        reader = threading.Thread(target=read, name="quorum-stream", daemon=True)
        reader.start()
        self._stub, self._call, self._requests, self._answers, self._reader = stub, call, requests, answers, reader

    def close(self, goodbye: bool = False) -> None:
        """End the stream (a no-op when none is open); its reader thread ends with it.
        `goodbye`: the stream is idle and the leader lives on (it moves to the quorum port):
        the controller is let see the requests end (up to GOODBYE_S) before the call is
        cancelled, since a stream cancelled without one makes its replica suspect."""
        if self._call is not None:
            call, requests, reader = self._call, self._requests, self._reader
            self._stub = self._call = self._requests = self._answers = self._reader = None
            requests.put(_END)
            if goodbye and reader is not None:
                reader.join(GOODBYE_S)
            call.cancel()
