"""Every rank's connection to its replica's coordinator (rank 0's included): one blocking socket.

`connect` retries while rank 0 starts (or is busy with other hellos), then authenticates
both ways: it tags the coordinator's challenge with the job secret's coordinator key, and
accepts only a welcome tagged over its own fresh nonce (a stranger listening at the
address cannot pose as the coordinator). In a replica with relays (fthsdp/step/relay.py)
the coordinator's welcome names the rank's relay; the rank then connects there and says
its hello again, to the relay (which authenticates the same way); a relay never sends it on.
A relay rank's client (`for_rank`) hosts its group's relay and stops it when it closes.
`receive(timeout_s, wake_fd)` returns the next decoded frame, or None when the timeout passed or `wake_fd` became
readable (the catch-up fetch signals its end that way), so the Manager waits on the
coordinator and the fetch at once. Partial frames survive a timeout. Any failure of the
connection -- closed, reset, a bad frame, a refusal -- raises ChannelError.
"""

from __future__ import annotations

import select
import socket
import time

from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.step.messages import (MAX_COORDINATOR_FRAME_BYTES, FrameReader, MessageError, decode_coordinator_frame,
                                  frame, sign_hello, welcome_is_authentic)
from fthsdp.step.relay import RelayService
from protos import replica_pb2 as rpb


class CoordinatorClient:
    def __init__(self, address: str, rank: int) -> None:
        self.address, self.rank = address, rank
        self.coordinator_address = address
        #: where this rank's relay listens, once the coordinator sent it there ("" : none)
        self.relay_address = ""
        #: the relay of this rank's group when this rank is its relay (started by for_rank)
        self.hosted: RelayService | None = None
        self._sock: socket.socket | None = None
        self._reader = FrameReader(MAX_COORDINATOR_FRAME_BYTES)
        self._ready: list[bytes] = []

    @classmethod
    def for_rank(cls, settings: RuntimeSettings, address: str, incarnation: str = "") -> "CoordinatorClient":
        """The client of rank `settings.rank` for the coordinator at `address`. A relay rank (the
        first of its group, fthsdp/step/relay_tree.py) starts its group's relay first -- its own
        connection goes through it like its group's others' -- and closes it with this client."""
        client = cls(address, settings.rank)
        if settings.rank in settings.relay_tree().relays:
            client.hosted = RelayService(settings, address, settings.bind_host, incarnation=incarnation).start()
        return client

    def connect(self, timeout_s: float, hello: rpb.RankFrame, key: bytes | None) -> "CoordinatorClient":
        """Reach the coordinator and authenticate (`key`: the coordinator key of the job secret;
        None when the ports run without authentication), all within timeout_s. On failure the
        relay this rank hosts is stopped too."""
        try:
            return self._connect(timeout_s, hello, key)
        except BaseException:
            self.close()
            raise

    def _connect(self, timeout_s: float, hello: rpb.RankFrame, key: bytes | None) -> "CoordinatorClient":
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            self._reader, self._ready = FrameReader(MAX_COORDINATOR_FRAME_BYTES), []
            host, _, port = self.address.rpartition(":")
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sock.settimeout(None)
                answer = self._handshake(hello, key, deadline)
                if answer is True:
                    return self
                if answer:  # the coordinator sends this rank to its relay
                    if self.relay_address:
                        raise ChannelError(f"rank {self.rank}: its relay at {self.address} sent it on to {answer}")
                    self._drop()
                    self.relay_address = self.address = answer
                    continue
                reason: object = "it is busy with other hellos"
            except OSError as exc:
                reason = exc
            except ChannelError:
                self._drop()
                raise
            self._drop()
            if time.monotonic() + delay > deadline:
                raise ChannelError(f"rank {self.rank} could not reach its coordinator at {self.address} within "
                                   f"{timeout_s:g}s: {reason}")
            time.sleep(delay)  # rank 0 may still be starting
            delay = min(delay * 2, 0.5)

    def _handshake(self, hello: rpb.RankFrame, key: bytes | None, deadline: float) -> bool | str:
        """Challenge, hello, welcome. False when the coordinator asks to try again later; the
        address of the rank's relay when the (authenticated) welcome names one."""
        first = self._next_before(deadline, "its challenge")
        if first[0] == "refusal" and first[1].retry:
            return False
        if first[0] != "challenge":
            raise ChannelError(f"rank {self.rank}: {self.address} sent a {first[0]} instead of a challenge; "
                               f"is a coordinator listening there?")
        signed = sign_hello(key, hello, first[1].nonce)
        self.send(signed)
        kind, answer = self._next_before(deadline, "its welcome")
        if kind == "refusal":  # a retry: the rank's relay has not reached the coordinator yet
            return False
        if kind != "welcome":
            raise ChannelError(f"rank {self.rank}: {self.address} sent a {kind} instead of a welcome")
        if key is not None and not welcome_is_authentic(key, answer, signed.hello, first[1].nonce):
            raise ChannelError(f"rank {self.rank}: whoever answers at {self.address} does not hold the job secret "
                               f"(its welcome is not authenticated); it is not this replica's coordinator")
        return answer.relay_address or True

    def _next_before(self, deadline: float, what: str) -> tuple[str, object]:
        try:
            got = self.receive(deadline - time.monotonic(), refusal_raises=False)
        except ChannelError as exc:
            raise ChannelError(f"{exc} (waiting for {what})") from None
        if got is None:
            raise ChannelError(f"rank {self.rank}: the coordinator at {self.address} sent no {what} in time")
        if got[0] == "refusal" and not got[1].retry:
            raise ChannelError(f"the coordinator refused rank {self.rank}: {got[1].reason}")
        return got

    def fileno(self) -> int:
        assert self._sock is not None, "connect() first"
        return self._sock.fileno()

    def send(self, message: rpb.RankFrame) -> None:
        assert self._sock is not None, "connect() first"
        try:
            self._sock.sendall(frame(message))
        except OSError as exc:
            raise ChannelError(f"rank {self.rank} lost its coordinator at {self.address}: {exc}") from exc

    def receive(self, timeout_s: float, wake_fd: int | None = None,
                refusal_raises: bool = True) -> tuple[str, object] | None:
        """The next frame as (kind, message); None after timeout_s or when wake_fd is readable."""
        assert self._sock is not None, "connect() first"
        deadline = time.monotonic() + max(timeout_s, 0.0)
        poller = select.poll()  # no FD_SETSIZE limit, unlike select()
        poller.register(self._sock, select.POLLIN)
        if wake_fd is not None:
            poller.register(wake_fd, select.POLLIN)
        while not self._ready:
            # timeout 0 (a look at what already arrived: between inner steps) never waits
            left_ms = 0 if timeout_s <= 0 else max(0, int((deadline - time.monotonic()) * 1000) + 1)
            ready = {fd for fd, _ in poller.poll(left_ms)}
            if self._sock.fileno() not in ready:
                if ready or time.monotonic() >= deadline:
                    return None  # woken, or timed out
                continue
            try:
                data = self._sock.recv(1 << 20)
            except OSError as exc:
                raise ChannelError(f"rank {self.rank} lost its coordinator at {self.address}: {exc}") from exc
            if not data:
                raise ChannelError(f"rank {self.rank}: the coordinator at {self.address} closed the connection")
            try:
                self._ready += self._reader.feed(data)
            except MessageError as exc:
                raise ChannelError(f"rank {self.rank} got a bad frame from its coordinator: {exc}") from exc
        body = self._ready.pop(0)
        try:
            kind, message = decode_coordinator_frame(body)
        except MessageError as exc:
            raise ChannelError(f"rank {self.rank} got a bad frame from its coordinator: {exc}") from exc
        if kind == "refusal" and refusal_raises:
            raise ChannelError(f"the coordinator refused rank {self.rank}: {message.reason}")
        return kind, message

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Hang up, then stop the relay this rank hosts, if any (it lets its ranks hang up first, bounded)."""
        self._drop()
        if self.hosted is not None:
            self.hosted.close()
            self.hosted = None
