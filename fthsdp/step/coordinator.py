"""The coordinator service rank 0 hosts for its replica: sockets and controller calls around
the pure `Coordination` (fthsdp/step/coordination.py).

One asyncio event loop on one thread serves every rank's TCP connection (built for 8,192
ranks: frames are parsed in an asyncio Protocol as bytes arrive, no task per message, and
a broadcast is encoded once and written to every socket). Controller calls (quorum,
reports) run on one worker thread, in the order the coordination asked for them, so a slow
controller never stalls the sockets; their results come back as events. Every rank --
rank 0's own Manager too -- is a client over TCP.

A connection authenticates before the coordination hears of it (fthsdp/step/messages.py):
it gets a challenge at once, and must answer with a hello tagged under the job secret
within hello_timeout_s, in at most MAX_HELLO_FRAME_BYTES; only then is the hello fed to the
coordination (which binds the rank to that connection, first come) and the rank welcomed.
Hellos are parsed as their bytes arrive, so a silent stranger delays nobody; at most
world_size + MAX_EXTRA_UNAUTHENTICATED connections may be unauthenticated at once (more are
refused with "retry"); a rank that stops reading its frames is cut off once
MAX_PENDING_WRITE_BYTES wait for it (fthsdp/step/peer_connection.py).

With relays (RuntimeSettings.relay_fanout, fthsdp/step/relay_tree.py) a relay's connection
authenticates with a relay hello instead, and a rank of a relayed group is welcomed with its
relay's address (its hello authenticated first; "retry" while that relay has not connected)
and hung up on; a broadcast is then one write per relay, not per rank.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from fthsdp.errors import ControllerRefused, JobCompleted, RuntimeFailure
from fthsdp.settings import RuntimeSettings
from fthsdp.step import coordination as co
from fthsdp.step.incarnations import stale_hello
from fthsdp.step.messages import MAX_RANK_FRAME_BYTES, decode_rank_frame, frame, hello_is_authentic, welcome
from fthsdp.step.peer_connection import MAX_PENDING_WRITE_BYTES, PeerConnection  # noqa: F401 - the bound, re-exported
from fthsdp.step.relay_messages import (MAX_RELAY_FRAME_BYTES, decode_first_frame, decode_relay_frame,
                                        relay_hello_is_authentic, relay_welcome)
from protos import controller_pb2 as pb
from protos import job_secret
from protos import replica_pb2 as rpb

log = logging.getLogger(__name__)
#: connections still saying hello, beyond one per rank, before new ones are told to retry
MAX_EXTRA_UNAUTHENTICATED = 64


class ControllerPort(Protocol):
    """What the coordinator needs of the controller (fthsdp/step/controller_client.py)."""

    def quorum(self, request: co.RequestQuorum, world_size: int, coordinator_address: str,
               timeout_s: float) -> pb.QuorumResponse: ...
    def report_step(self, report: co.ReportStep) -> None: ...
    def report_failure(self, report: co.ReportFailure) -> None: ...
    def report_finished(self, report: co.ReportFinished) -> str: ...
    def close(self) -> None: ...


class CoordinatorService:
    def __init__(self, settings: RuntimeSettings, controller: ControllerPort, host: str, port: int) -> None:
        self.settings, self.controller = settings, controller
        self._key = settings.port_key(job_secret.PURPOSE_COORDINATOR)  # refuses to start without a secret
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"coordinator-{settings.replica_id}")
        self._server: asyncio.base_events.Server | None = None
        self._core: co.Coordination | None = None
        self._connections: dict[int, PeerConnection] = {}
        self._unauthenticated: set[int] = set()
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = co.INF
        self._all_gone: asyncio.Event | None = None
        self.address = ""
        self.hello_timeout_s = settings.hello_timeout_s
        self.name = f"replica {settings.replica_id} coordinator"
        #: for benchmarks: [kind, perf_counter when written, seconds writing took, outcome, the
        #: event loop thread's CPU seconds so far] of the latest plan and decision broadcasts
        self.marks: collections.deque[list] = collections.deque(maxlen=64)

    @property
    def stage(self) -> co.Stage:
        assert self._core is not None
        return self._core.stage

    def start(self) -> "CoordinatorService":
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"coordinator-{self.settings.replica_id}",
                                        daemon=True)
        self._thread.start()
        try:  # a taken port (asyncio's error names the address) leaves no thread behind
            self.address = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(30.0)
        except BaseException:
            self.close(linger_s=0.0)
            raise
        log.info("replica %s: coordinator listening on %s for %d rank(s)", self.settings.replica_id, self.address,
                 self.settings.world_size)
        if self._key is None:
            log.warning("replica %s: the coordinator accepts ranks WITHOUT authentication (insecure trainer ports)",
                        self.settings.replica_id)
        return self

    async def _listen(self) -> str:
        self._all_gone = asyncio.Event()
        self._core = co.Coordination(self.settings, self._loop.time())
        backlog = min(self.settings.world_size + MAX_EXTRA_UNAUTHENTICATED + 16, 65535)
        self._server = await self._loop.create_server(lambda: PeerConnection(self, decode_first_frame), self._host, self._port,
                                                      backlog=backlog)
        self._reschedule()
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def checkpoint_saved(self, step: int) -> None:
        """Rank 0's Manager wrote the checkpoint of the state after committing `step` (any thread):
        later step reports name it."""
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._feed, co.CheckpointSaved(step))

    # ------------------------------------------------------------ events in (loop thread)

    def _feed(self, event: co.Event) -> None:
        assert self._core is not None
        before = self._core.stage
        try:
            effects = self._core.advance(event, self._loop.time())
        except co.ProtocolError:
            log.exception("replica %s: coordinator bug", self.settings.replica_id)
            return
        for effect in effects:
            self._execute(effect)
        if self._core.stage is not before:
            log.debug("replica %s: coordinator %s -> %s", self.settings.replica_id, before.name,
                      self._core.stage.name)
        self._reschedule()

    def _reschedule(self) -> None:
        assert self._core is not None
        at = self._core.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at != co.INF:
            self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, co.INF
        self._feed(co.Tick())

    def _connected(self, conn: PeerConnection) -> tuple[int, bool]:
        """The new connection's id, and whether it may say hello (False: too many are saying it)."""
        conn_id = next(self._ids)
        self._connections[conn_id] = conn
        if len(self._unauthenticated) >= self.settings.world_size + MAX_EXTRA_UNAUTHENTICATED:
            return conn_id, False
        self._unauthenticated.add(conn_id)
        return conn_id, True

    def _hello(self, conn: PeerConnection, kind: str, message) -> None:
        """A connection's first frame: a rank's hello (or a relay's), authenticated before the
        coordination hears of it. A rank behind a relay is welcomed with its relay's address."""
        if kind == "relay_hello":
            return self._relay_hello(conn, message)
        if kind != "hello":
            return conn.refuse(f"a {kind} before this connection's hello")
        if self._key is not None and not hello_is_authentic(self._key, message, conn.challenge):
            log.warning("replica %s: refused an unauthenticated hello (claiming rank %s) from %s",
                        self.settings.replica_id, message.rank, conn.transport.get_extra_info("peername"))
            return conn.refuse("hello not authenticated: its tag does not match this connection's challenge "
                               "under the job secret (a stranger, another job's secret, or a replayed hello)")
        stale = stale_hello(self.settings.replica_version, message.replica_version, message.rank)
        if stale is not None:  # a rank of another restart of the replica (fthsdp/step/incarnations.py)
            return conn.refuse(stale[0], retry=stale[1])
        core = self._core
        assert core is not None
        relay = core.relay_address(message.rank) if 0 <= message.rank < core.world else ""
        if relay is None:
            return conn.refuse(f"the relay of rank {message.rank}'s group is not connected yet; try again",
                               retry=True)
        if relay:  # the rank talks to its relay: tell it where (authenticated), and hang up
            conn.write(frame(welcome(self._key, message, conn.challenge, relay)))
            conn.refused = True
            conn.transport.close()
            return
        self._feed(co.FromRank(conn.conn_id, kind, message))
        if core.rank_of.get(conn.conn_id) == message.rank and not conn.refused:
            conn.admit(MAX_RANK_FRAME_BYTES, decode_rank_frame, message.rank)
            self._unauthenticated.discard(conn.conn_id)
            conn.write(frame(welcome(self._key, message, conn.challenge)))

    def _relay_hello(self, conn: PeerConnection, message) -> None:
        if self._key is not None and not relay_hello_is_authentic(self._key, message, conn.challenge):
            log.warning("replica %s: refused an unauthenticated relay hello (claiming group %s) from %s",
                        self.settings.replica_id, message.group, conn.transport.get_extra_info("peername"))
            return conn.refuse("relay hello not authenticated: its tag does not match this connection's challenge "
                               "under the job secret")
        self._feed(co.FromRank(conn.conn_id, "relay_hello", message))
        core = self._core
        assert core is not None
        if core.link_group.get(conn.conn_id) == message.group and not conn.refused:
            conn.admit(MAX_RELAY_FRAME_BYTES, decode_relay_frame, ("relay", message.group))
            self._unauthenticated.discard(conn.conn_id)
            conn.write(frame(relay_welcome(self._key, message, conn.challenge)))

    def _received(self, conn: PeerConnection, kind: str, message) -> None:
        self._feed(co.FromRank(conn.conn_id, kind, message))

    def _disconnected(self, conn: PeerConnection, reason: str) -> None:
        conn_id = conn.conn_id
        self._connections.pop(conn_id, None)
        self._unauthenticated.discard(conn_id)
        self._feed(co.ConnectionLost(conn_id, reason))
        if not self._connections and self._all_gone is not None:
            self._all_gone.set()

    # ------------------------------------------------------------ effects out

    def _execute(self, effect: co.Effect) -> None:
        if isinstance(effect, co.Broadcast):
            self._broadcast(effect.frame)
        elif isinstance(effect, co.SendEach):
            self._send_each(effect.frames)
        elif isinstance(effect, co.SendTo):
            conn = self._connections.get(effect.conn)
            if conn is not None:
                conn.write(frame(effect.frame))
        elif isinstance(effect, co.Refuse):
            conn = self._connections.get(effect.conn)
            log.warning("replica %s: refused a rank connection: %s", self.settings.replica_id, effect.reason)
            if conn is not None:
                conn.refuse(effect.reason)
        elif isinstance(effect, co.RequestQuorum):
            self._worker.submit(self._quorum, effect)
        elif isinstance(effect, co.ReportStep):
            if effect.note:
                log.warning("replica %s: step %s reported without a digest: %s", self.settings.replica_id,
                            effect.step, effect.note)
            self._worker.submit(self._best_effort, self.controller.report_step, effect)
        elif isinstance(effect, co.ReportFailure):
            log.warning("replica %s: step %s of quorum %s %s: %s", self.settings.replica_id, effect.step,
                        effect.quorum_id, "failed for good" if effect.dead else "will be retried", effect.reason)
            self._worker.submit(self._best_effort, self.controller.report_failure, effect)
        elif isinstance(effect, co.ReportFinished):
            after = f"after step {effect.step}" if effect.step >= 0 else "before its first commit"
            log.info("replica %s finished %s: %s", self.settings.replica_id, after, effect.reason)
            self._worker.submit(self._finish, effect)
        else:
            raise TypeError(f"unknown coordinator effect {effect!r}")

    def _broadcast(self, message: rpb.CoordinatorFrame) -> None:
        data = frame(message)  # encoded once for every rank
        assert self._core is not None
        mark = self._mark(message)
        for conn_id in self._core.links():
            conn = self._connections.get(conn_id)
            if conn is not None:
                conn.write(data)
        if mark is not None:
            mark[2] = time.perf_counter() - mark[1]

    def _send_each(self, frames: tuple[tuple[int, rpb.CoordinatorFrame], ...]) -> None:
        mark = self._mark(frames[0][1]) if frames else None
        for conn_id, message in frames:
            conn = self._connections.get(conn_id)
            if conn is not None:
                conn.write(frame(message))
        if mark is not None:
            mark[2] = time.perf_counter() - mark[1]

    def _mark(self, message: rpb.CoordinatorFrame) -> list | None:
        """Note a plan or decision before its first write (a rank may answer at once)."""
        kind = message.WhichOneof("body")
        if kind not in ("plan", "decision"):
            return None
        outcome = rpb.StepDecision.Outcome.Name(message.decision.outcome) if kind == "decision" else ""
        mark = [kind, time.perf_counter(), 0.0, outcome, time.thread_time()]
        self.marks.append(mark)
        return mark

    # ------------------------------------------------------------ controller calls (worker thread)

    def _quorum(self, request: co.RequestQuorum) -> None:
        s = self.settings
        try:
            answer = self.controller.quorum(request, s.world_size, self.address, s.quorum_timeout_s)
            event: co.Event = co.QuorumAnswered(answer)
        except JobCompleted as exc:
            event = co.QuorumFailed(co.QuorumRefusal.FINISHED, str(exc))
        except ControllerRefused as exc:
            event = co.QuorumFailed(co.QuorumRefusal.FATAL, str(exc))
        except Exception as exc:  # noqa: BLE001 - unavailable, or anything else: a retry, counted
            event = co.QuorumFailed(co.QuorumRefusal.RETRY, str(exc) if isinstance(exc, RuntimeFailure)
                                    else f"quorum request failed: {exc!r}")
        self._loop.call_soon_threadsafe(self._feed, event)

    def _best_effort(self, call, report) -> None:
        try:
            call(report)
        except Exception as exc:  # noqa: BLE001 - a lost report is logged, never fatal
            log.warning("replica %s: %s to the controller failed: %s", self.settings.replica_id,
                        type(report).__name__, exc)

    def _finish(self, report: co.ReportFinished) -> None:
        detail = ""
        try:
            detail = self.controller.report_finished(report)
        except Exception as exc:  # noqa: BLE001 - the ranks still get their last word
            detail = f"the controller did not take the report: {exc}"
            log.warning("replica %s: %s", self.settings.replica_id, detail)
        self._loop.call_soon_threadsafe(self._feed, co.FinishReported(detail))

    # ------------------------------------------------------------ shutdown

    def close(self, linger_s: float = 5.0) -> None:
        """Wait (at most linger_s) for every rank to hang up -- they do after the last word --
        then stop serving, and close the controller client."""
        async def shut() -> None:
            if self._connections and self._all_gone is not None:
                try:
                    await asyncio.wait_for(self._all_gone.wait(), linger_s)
                except asyncio.TimeoutError:
                    log.info("replica %s: %d rank(s) still connected at shutdown", self.settings.replica_id,
                             len(self._connections))
            if self._server is not None:
                self._server.close()
            for conn in list(self._connections.values()):
                conn.transport.close()
            if self._timer is not None:
                self._timer.cancel()
        if self._thread is not None:
            try:
                asyncio.run_coroutine_threadsafe(shut(), self._loop).result(linger_s + 5.0)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(5.0)
                self._thread = None
        # Queued controller calls are dropped; closing the client cancels the one in flight.
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.controller.close()
