"""The intra-replica channel: the leader (rank 0) fans out quorum plans and tallies votes.

Leader side: one asyncio event loop on one thread serves every rank's TCP connection
(built for 8,192 ranks: no thread per rank, a message is encoded once and written to
every socket). Rank side: one blocking socket. Frames are a 4-byte big-endian length
and a JSON object with a "t" (type) field:
    rank -> leader: hello{rank}, vote{rank, quorum_id, step, ok, reason}
    leader -> rank: plan{view | error}, decision{quorum_id, step, outcome, reason}
A rank whose connection drops counts as a "no" vote.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
import time
from typing import Any

from fthsdp.commit_votes import CommitDecision, Outcome, Vote, tally_votes

log = logging.getLogger(__name__)

FRAME = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20


class ChannelError(Exception):
    """The intra-replica channel failed: a peer vanished, a deadline passed, a frame was bad."""


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    return FRAME.pack(len(body)) + body


class LeaderChannel:
    """Rank 0's side. `start()` launches the loop thread; the other methods block the caller."""

    def __init__(self, host: str, port: int, world_size: int) -> None:
        self._host, self._port, self.world_size = host, port, world_size
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: dict[int, _RankConnection] = {}
        self._votes: dict[tuple[int, int], dict[int, Vote]] = {}
        self._lost: set[int] = set()
        self.hellos: dict[int, dict[str, Any]] = {}  # what each rank said when it connected
        self._changed: asyncio.Event | None = None
        self.address = ""

    def _call(self, coro: Any, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self) -> "LeaderChannel":
        self._thread = threading.Thread(target=self._loop.run_forever, name="leader-channel", daemon=True)
        self._thread.start()
        self.address = self._call(self._listen(), 30.0)
        return self

    async def _listen(self) -> str:
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _RankConnection(self), self._host, self._port,
                                                backlog=min(self.world_size + 16, 65535))
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def _notify(self) -> None:
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    def _on_message(self, conn: "_RankConnection", msg: dict[str, Any]) -> None:
        if msg.get("t") == "hello":
            conn.rank = int(msg["rank"])
            self._writers[conn.rank] = conn
            self.hellos[conn.rank] = msg
            self._lost.discard(conn.rank)
        elif msg.get("t") == "vote":
            vote = Vote(int(msg["rank"]), int(msg["quorum_id"]), int(msg["step"]), bool(msg["ok"]),
                        str(msg.get("reason", "")))
            votes = self._votes.setdefault((vote.quorum_id, vote.step), {})
            votes[vote.rank] = vote
            # Wake the collector only when it can decide: a no, or the last vote in.
            if vote.ok and len(votes) < self.world_size - 1:
                return
        self._notify()

    def _on_lost(self, conn: "_RankConnection", exc: Exception | None) -> None:
        if conn.rank >= 0 and self._writers.get(conn.rank) is conn:
            if exc is not None:
                log.warning("rank %s left the intra-replica channel: %r", conn.rank, exc)
            del self._writers[conn.rank]
            self._lost.add(conn.rank)
            self._notify()

    def wait_for_ranks(self, timeout_s: float) -> None:
        """Block until ranks 1..world_size-1 said hello."""
        async def wait() -> None:
            deadline = time.monotonic() + timeout_s
            while len(self._writers) < self.world_size - 1:
                assert self._changed is not None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelError(f"only {len(self._writers)} of {self.world_size - 1} ranks "
                                       f"connected within {timeout_s}s")
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
        self._call(wait())

    def broadcast(self, msg: dict[str, Any], timeout_s: float = 60.0) -> None:
        """Send one message to every connected rank (encoded once)."""
        frame = encode(msg)

        async def send() -> None:
            for conn in list(self._writers.values()):
                conn.transport.write(frame)  # small frames usually go straight to the socket
            paused = [conn.drained for conn in self._writers.values() if not conn.drained.done()]
            if paused:
                await asyncio.gather(*paused, return_exceptions=True)
        self._call(send(), timeout_s)

    def collect_votes(self, quorum_id: int, step: int, own: Vote, timeout_s: float) -> CommitDecision:
        """Wait for every rank's vote on (quorum_id, step); lost ranks vote no. Pure tally decides."""
        async def collect() -> CommitDecision:
            deadline = time.monotonic() + timeout_s
            while True:
                votes = dict(self._votes.get((quorum_id, step), {}))
                votes[0] = own
                for rank in self._lost:
                    votes.setdefault(rank, Vote(rank, quorum_id, step, False, "disconnected"))
                left = deadline - time.monotonic()
                decision = tally_votes(votes, self.world_size, quorum_id, step, left <= 0)
                if decision.outcome is not Outcome.PENDING:
                    self._votes = {k: v for k, v in self._votes.items() if k[0] >= quorum_id}
                    self._votes.pop((quorum_id, step), None)
                    return decision
                assert self._changed is not None
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
        return self._call(collect())

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._writers.values()):
                conn.transport.close()
        if self._thread is not None:
            try:
                self._call(shut(), 5.0)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(5.0)


class _RankConnection(asyncio.Protocol):
    """One rank's connection on the leader: frames are parsed as bytes arrive (no task or
    future per message), which is what lets one thread serve thousands of ranks."""

    def __init__(self, channel: LeaderChannel) -> None:
        self.channel = channel
        self.rank = -1
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.drained: asyncio.Future = asyncio.get_running_loop().create_future()
        self.drained.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            while len(self.buffer) >= FRAME.size:
                (length,) = FRAME.unpack_from(self.buffer)
                if length > MAX_FRAME_BYTES:
                    raise ChannelError(f"frame of {length} bytes from rank {self.rank}")
                if len(self.buffer) < FRAME.size + length:
                    return
                msg = json.loads(bytes(self.buffer[FRAME.size:FRAME.size + length]))
                del self.buffer[:FRAME.size + length]
                self.channel._on_message(self, msg)
        except (ValueError, KeyError, TypeError, ChannelError) as exc:
            if self.rank >= 0:
                log.warning("rank %s sent a bad frame: %r", self.rank, exc)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.buffer and self.rank >= 0:
            log.warning("rank %s left the intra-replica channel mid-message", self.rank)
        self.channel._on_lost(self, exc)
        if not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if not self.drained.done():
            self.drained.set_result(None)


class RankChannel:
    """A non-leader rank's side: one blocking socket to the leader."""

    def __init__(self, leader_address: str, rank: int) -> None:
        self.leader_address, self.rank = leader_address, rank
        self._sock: socket.socket | None = None

    def connect(self, timeout_s: float, **hello: Any) -> "RankChannel":
        """Connect (retrying while the leader starts) and say hello with `hello`'s extra fields."""
        host, _, port = self.leader_address.rpartition(":")
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise ChannelError(f"rank {self.rank} could not reach its leader at "
                                       f"{self.leader_address} within {timeout_s}s: {exc}") from exc
                time.sleep(delay)  # the leader may still be starting
                delay = min(delay * 2, 1.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send({**hello, "t": "hello", "rank": self.rank})
        return self

    def send(self, msg: dict[str, Any]) -> None:
        assert self._sock is not None, "connect() first"
        try:
            self._sock.sendall(encode(msg))
        except OSError as exc:
            raise ChannelError(f"rank {self.rank} lost its leader: {exc}") from exc

    def _recv_exact(self, n: int) -> bytes:
        assert self._sock is not None
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ChannelError(f"rank {self.rank}: the leader closed the channel")
            buf += chunk
        return bytes(buf)

    def recv(self, timeout_s: float) -> dict[str, Any]:
        assert self._sock is not None, "connect() first"
        self._sock.settimeout(timeout_s)
        try:
            (length,) = FRAME.unpack(self._recv_exact(FRAME.size))
            return json.loads(self._recv_exact(length))
        except (OSError, ValueError) as exc:
            raise ChannelError(f"rank {self.rank} got no message from its leader within {timeout_s}s: {exc}") from exc

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
