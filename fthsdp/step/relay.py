"""A relay: the service a relay rank hosts for its group of the relay tree. I/O only.

The tree and what goes up are fthsdp/step/relay_tree.py's; this module moves bytes. A relay
keeps one connection up to the replica's coordinator (authenticated with a relay hello under
the job secret's coordinator key, retried while rank 0 starts) and accepts its group's rank
connections exactly as the coordinator does (fthsdp/step/peer_connection.py: a challenge, a
hello tagged under the same key, a welcome; at most fanout + MAX_EXTRA_UNAUTHENTICATED
connections saying hello at once). The relay rank's own Manager is one of those ranks.

- down: a frame from the coordinator is written, as it came, to every rank of the group; a
  to_ranks frame's parts each to its one rank (a refusal among them closes that rank);
- up: a rank's hello and close go up one by one (`relayed`); begins, votes and digests
  aggregated (a group begin, the first no at once or one yes, a group's digests); a rank's
  broken connection as a `rank_left`. A gather still incomplete FLUSH_FRACTION of
  gather_timeout_s after its first message sends up what the members that answered said
  (relay_tree's `flush`): one silent rank never silences its group.

When the connection up breaks, the relay closes every rank's connection: its ranks see their
coordinator gone, as they would without a relay, and the coordinator counts them absent.
The relay keeps no other state: a relay that restarts is a new relay of a new replica.

`RelayService(...).start()` runs it on its own thread; `open()` / `aclose()` run it on the
caller's event loop (the benchmarks host many relays on one loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.step import messages as msg
from fthsdp.step import relay_messages as rm
from fthsdp.step.incarnations import stale_hello
from fthsdp.step.messages import FRAME, MAX_COORDINATOR_FRAME_BYTES, MAX_RANK_FRAME_BYTES, FrameReader, MessageError
from fthsdp.step.peer_connection import PeerConnection
from fthsdp.step.relay_tree import FLUSH_FRACTION, BeginGather, DigestGather, VoteGather
from protos import job_secret
from protos import replica_pb2 as rpb

log = logging.getLogger(__name__)
#: connections still saying hello, beyond one per rank of the group, before new ones are told to retry
MAX_EXTRA_UNAUTHENTICATED = 16


class RelayService:
    def __init__(self, settings: RuntimeSettings, coordinator_address: str, host: str, port: int = 0,
                 incarnation: str = "") -> None:
        tree = settings.relay_tree()
        if settings.rank not in tree.relays:
            raise ValueError(f"rank {settings.rank} is not a relay of {tree.world_size} ranks in groups of "
                             f"{tree.fanout} (the relays are every group's first rank but group 0's)")
        self.settings, self.tree = settings, tree
        self.group = tree.group_of(settings.rank)
        self.members = tree.members(self.group)
        self._key = settings.port_key(job_secret.PURPOSE_COORDINATOR)  # refuses to start without a secret
        self._coordinator_address, self._host, self._port = coordinator_address, host, port
        self._incarnation = incarnation
        self.hello_timeout_s = settings.hello_timeout_s
        self.name = f"replica {settings.replica_id} relay of group {self.group}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._up: _Upstream | None = None
        self._connections: dict[int, PeerConnection] = {}
        self._unauthenticated: set[int] = set()
        self._ranks: dict[int, PeerConnection] = {}  # rank -> its authenticated connection
        self._ids = 0
        self._begins = BeginGather(self.members)
        self._votes: VoteGather | None = None
        self._digests: DigestGather | None = None
        self._all_gone: asyncio.Event | None = None
        #: gather kind -> the pending flush of its current gather
        self._flushes: dict[str, asyncio.TimerHandle] = {}
        self.address = ""

    # ------------------------------------------------------------ life

    def start(self) -> "RelayService":
        """Listen, reach the coordinator and authenticate (within quorum_timeout_s), on a thread."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.open(), self._loop).result(self.settings.quorum_timeout_s + 10.0)
        except BaseException:
            self.close()
            raise
        return self

    async def open(self) -> str:
        """Listen for the group's ranks and connect up (on the running loop); the listening address."""
        self._loop = asyncio.get_running_loop()
        self._all_gone = asyncio.Event()
        self._server = await self._loop.create_server(lambda: PeerConnection(self, msg.decode_rank_frame),
                                                      self._host, self._port,
                                                      backlog=len(self.members) + MAX_EXTRA_UNAUTHENTICATED)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        await self._connect_up(self._loop.time() + self.settings.quorum_timeout_s)
        log.info("%s: relaying ranks %d..%d at %s", self.name, self.members.start, self.members.stop - 1, self.address)
        return self.address

    async def _connect_up(self, deadline: float) -> None:
        host, _, port = self._coordinator_address.rpartition(":")
        hello = rm.relay_hello(self.group, self.tree.fanout, self.tree.world_size, self.settings.job_id,
                               self.settings.replica_id, self.address, self._incarnation)
        delay, reason = 0.02, "no try"
        while True:
            up = _Upstream(self, hello)
            try:
                await asyncio.wait_for(self._loop.create_connection(lambda: up, host, int(port)),
                                       max(0.1, deadline - self._loop.time()))
                if await asyncio.wait_for(up.welcomed, max(0.1, deadline - self._loop.time())):
                    self._up = up
                    return
                reason = "it is busy with other hellos"
            except (OSError, asyncio.TimeoutError) as exc:
                reason = repr(exc)
            if up.transport is not None:
                up.transport.close()
            if self._loop.time() + delay > deadline:
                raise ChannelError(f"{self.name} could not reach its coordinator at {self._coordinator_address} "
                                   f"within {self.settings.quorum_timeout_s:g}s: {reason}")
            await asyncio.sleep(delay)  # rank 0 may still be starting
            delay = min(delay * 2, 0.5)

    async def aclose(self, linger_s: float = 5.0) -> None:
        """Wait (at most linger_s) for the ranks to hang up -- they do after the last word -- then stop."""
        if self._connections and self._all_gone is not None and self._up is not None and self._up.open:
            try:
                await asyncio.wait_for(self._all_gone.wait(), linger_s)
            except asyncio.TimeoutError:
                log.info("%s: %d rank(s) still connected at shutdown", self.name, len(self._connections))
        if self._server is not None:
            self._server.close()
        for kind in list(self._flushes):
            self._disarm(kind)
        for conn in list(self._connections.values()):
            conn.transport.close()
        if self._up is not None and self._up.transport is not None:
            self._up.transport.close()

    def close(self, linger_s: float = 5.0) -> None:
        if self._thread is None or self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.aclose(linger_s), self._loop).result(linger_s + 5.0)
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.debug("%s: closing: %r", self.name, exc)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            self._thread = None

    # ------------------------------------------------------------ the group's ranks (PeerConnection's server)

    def _connected(self, conn: PeerConnection) -> tuple[int, bool]:
        self._ids += 1
        self._connections[self._ids] = conn
        if self._up is None or not self._up.open or \
                len(self._unauthenticated) >= len(self.members) + MAX_EXTRA_UNAUTHENTICATED:
            return self._ids, False
        self._unauthenticated.add(self._ids)
        return self._ids, True

    def _hello(self, conn: PeerConnection, kind: str, h) -> None:
        s = self.settings
        if kind != "hello":
            return conn.refuse(f"a {kind} before this connection's hello")
        if self._key is not None and not msg.hello_is_authentic(self._key, h, conn.challenge):
            log.warning("%s: refused an unauthenticated hello (claiming rank %s) from %s", self.name, h.rank,
                        conn.transport.get_extra_info("peername"))
            return conn.refuse("hello not authenticated: its tag does not match this connection's challenge "
                               "under the job secret (a stranger, another job's secret, or a replayed hello)")
        stale = stale_hello(s.replica_version, h.replica_version, h.rank)
        if stale is not None:  # a rank of another restart of the replica (fthsdp/step/incarnations.py)
            return conn.refuse(stale[0], retry=stale[1])
        if (h.job_id, h.replica_id, h.world_size) != (s.job_id, s.replica_id, s.world_size):
            return conn.refuse(f"hello for job {h.job_id!r} replica {h.replica_id!r} of world_size {h.world_size}; "
                               f"this relay serves job {s.job_id!r} replica {s.replica_id!r} of {s.world_size}")
        if h.rank not in self.members:
            return conn.refuse(f"rank {h.rank} is not in this relay's group (ranks {self.members.start}.."
                               f"{self.members.stop - 1})")
        if h.rank in self._ranks:
            return conn.refuse(f"rank {h.rank} is already connected (a second process claims it)")
        self._unauthenticated.discard(conn.conn_id)
        conn.admit(MAX_RANK_FRAME_BYTES, msg.decode_rank_frame, h.rank)
        self._ranks[h.rank] = conn
        conn.write(msg.frame(msg.welcome(self._key, h, conn.challenge)))
        self._send_up(rm.relayed(h.rank, rpb.RankFrame(hello=h)))

    def _received(self, conn: PeerConnection, kind: str, m) -> None:
        rank = conn.bound
        if kind == "begin":
            begins = self._begins.begin(rank, m.step)
            self._send_begins(begins)
            if begins and not self._begins.steps:
                self._disarm("begin")  # the group's begin went up whole
            elif self._begins.steps:
                self._arm("begin")
        elif kind == "vote":
            if self._votes is None or m.attempt > self._votes.attempt:
                self._votes = VoteGather(self.members, m.attempt)
                self._disarm("vote")
            self._send_votes(self._votes.vote(rank, m.attempt, m.ok, m.reason, m.loss, m.tokens))
            self._arm("vote")
        elif kind == "digest":
            if self._digests is None or (m.attempt, m.step) > (self._digests.attempt, self._digests.step):
                self._digests = DigestGather(self.members, m.attempt, m.step)
                self._disarm("digest")
            self._send_digests(self._digests.digest(rank, m.attempt, m.step, m.sha256))
            self._arm("digest")
        elif kind == "close":
            self._send_up(rm.relayed(rank, rpb.RankFrame(close=m)))
        else:
            conn.refuse(f"rank {rank} sent a {kind} after its hello")

    def _send_begins(self, begins) -> None:
        for b in begins:
            self._send_up(rm.group_begin(b.step, b.ranks))

    def _send_votes(self, votes) -> None:
        for v in votes:
            self._send_up(rm.group_vote(v.attempt, v.ok, v.ranks, v.reason, v.loss_sum, v.tokens))

    def _send_digests(self, digests) -> None:
        for d in digests:
            self._send_up(rm.group_digests(d.attempt, d.step, d.digests))

    def _arm(self, kind: str) -> None:
        """Flush the current `kind` gather FLUSH_FRACTION of gather_timeout_s from now, unless one is due."""
        pending = self._flushes.get(kind)
        if (pending is None or pending.cancelled()) and self._loop is not None:
            self._flushes[kind] = self._loop.call_later(self.settings.gather_timeout_s * FLUSH_FRACTION,
                                                        self._flush, kind)

    def _disarm(self, kind: str) -> None:
        pending = self._flushes.pop(kind, None)
        if pending is not None:
            pending.cancel()

    def _flush(self, kind: str) -> None:
        """Up with what the members that answered said (a silent one's goes up when it comes)."""
        self._flushes.pop(kind, None)
        if kind == "begin":
            self._send_begins(self._begins.flush())
        elif kind == "vote" and self._votes is not None:
            self._send_votes(self._votes.flush())
        elif kind == "digest" and self._digests is not None:
            self._send_digests(self._digests.flush())

    def _disconnected(self, conn: PeerConnection, reason: str) -> None:
        self._connections.pop(conn.conn_id, None)
        self._unauthenticated.discard(conn.conn_id)
        if conn.authenticated and self._ranks.get(conn.bound) is conn:
            del self._ranks[conn.bound]
            self._send_up(rm.rank_left(conn.bound, reason))
        if not self._connections and self._all_gone is not None:
            self._all_gone.set()

    # ------------------------------------------------------------ the coordinator

    def _send_up(self, frame: rpb.RankFrame) -> None:
        if self._up is not None and self._up.open:
            self._up.transport.write(msg.frame(frame))

    def _down(self, body: bytes) -> None:
        """One frame from the coordinator (after the welcome)."""
        kind, message = rm.decode_down_frame(body)
        if kind != "to_ranks":
            data = FRAME.pack(len(body)) + body  # as it came, once for every rank
            for conn in list(self._ranks.values()):
                conn.write(data)
            return
        for rank, inner_kind, inner in message:
            conn = self._ranks.get(rank) if rank in self.members else None
            if conn is None:
                continue  # gone, or not this group's (a coordinator bug: nobody else gets it)
            conn.write(FRAME.pack(len(inner)) + inner)
            if inner_kind == "refusal":
                conn.refused = True
                conn.transport.close()

    def _lost_up(self, reason: str) -> None:
        """The coordinator is gone: so is this relay, for its ranks."""
        log.log(logging.WARNING if self._ranks else logging.INFO, "%s: lost the coordinator: %s; closing its %d "
                "rank(s)", self.name, reason, len(self._ranks))
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections.values()):
            conn.refused = True
            conn.transport.close()  # after what is buffered for it: a refusal of the coordinator's says why


class _Upstream(asyncio.Protocol):
    """The relay's connection to the coordinator: challenge, relay hello, welcome, then frames down."""

    def __init__(self, relay: RelayService, hello: rpb.RankFrame) -> None:
        self.relay, self.hello = relay, hello
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(msg.MAX_HELLO_FRAME_BYTES)
        self.welcomed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.signed: rpb.RankFrame | None = None
        self.challenge = b""
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            for body in self.reader.feed(data):
                if self.open:
                    self.relay._down(body)
                else:
                    self._handshake(body)
        except (MessageError, ChannelError) as exc:
            self._fail(str(exc))
            assert self.transport is not None
            self.transport.abort()

    def _handshake(self, body: bytes) -> None:
        kind, m = msg.decode_coordinator_frame(body)
        key = self.relay._key
        if kind == "refusal":
            if not m.retry:
                raise ChannelError(f"{self.relay.name}: the coordinator refused the relay: {m.reason}")
            self.welcomed.done() or self.welcomed.set_result(False)
        elif kind == "challenge" and self.signed is None:
            self.challenge = m.nonce
            self.signed = rm.sign_relay_hello(key, self.hello, m.nonce)
            assert self.transport is not None
            self.transport.write(msg.frame(self.signed))
        elif kind == "welcome" and self.signed is not None:
            if key is not None and not rm.relay_welcome_is_authentic(key, m, self.signed.relay_hello, self.challenge):
                raise ChannelError(f"{self.relay.name}: whoever answers at {self.relay._coordinator_address} does "
                                   f"not hold the job secret (its welcome is not authenticated)")
            self.open = True
            self.reader.limit = MAX_COORDINATOR_FRAME_BYTES
            self.welcomed.done() or self.welcomed.set_result(True)
        else:
            raise ChannelError(f"{self.relay.name}: the coordinator sent a {kind} during the relay's hello")

    def _fail(self, reason: str) -> None:
        if not self.welcomed.done():
            self.welcomed.set_exception(ChannelError(reason))

    def connection_lost(self, exc: Exception | None) -> None:
        reason = repr(exc) if exc else "it closed the connection"
        if self.open:
            self.open = False
            self.relay._lost_up(reason)
        else:
            self._fail(f"{self.relay.name}: the coordinator closed the connection during the relay's hello ({reason})")
