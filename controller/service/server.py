"""ControllerServer: the thin shell around the controller's core (controller.core.core).

It owns the event loop side of things: the gRPC and HTTP servers, leadership in the store,
persisting snapshots, waking rounds on time, and delivering orders to agent streams. All
state changes happen on the event loop thread, one request at a time, so the core needs
no locks. Nothing starts in __init__; `start()` binds and serves, `stop()` drains.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import ssl
import time
import uuid
from collections import defaultdict
from dataclasses import replace

import grpc
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller.core.credentials import Credentials
from controller.core.errors import FailedPrecondition, PermissionDenied
from controller.core.host_records import HOST_SHARDS
from controller.core.identity import CertBinding
from controller.core.model import Event, JoinRequest, OrderOut
from controller.core.commands import CloseRound, ConnectionLost, Join, LeaveRound, Tick, WriteFailed
from controller.core.core import ControllerCore
from controller.core.pending_writes import write_order
from controller.core.ready import Ready
from controller.core.view import ControllerView
from controller.freed_memory import trim_freed_memory
from controller.service import event_log
from controller.service.campaign import Campaign
from controller.service.errors import NotLeader
from controller.service.grpc_api import SERVICE_NAME, ControllerServicer, add_to_server
from controller.service.metrics import Metrics
from controller.service.orders import to_proto_order
from controller.service.peer import certificate_identities
from controller.service.quorum_answer import QuorumAnswers
from controller.service.quorum_port import QuorumPort
from controller.service.section_writer import SectionsUnwritten, SectionWriter
from controller.settings import ControllerSettings
from controller.store import Leadership, MemoryStore, Store, StoreError
from protos.job_secret import JobSecret

log = logging.getLogger("fthsdp.controller")


class PortInUse(OSError):
    """One of the controller's listeners (`listener`: "grpc", "http" or "quorum") could not
    bind its port; `cause` is the bind's error (EADDRINUSE: another process holds it)."""

    def __init__(self, listener: str, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.listener, self.host, self.port, self.cause = listener, host, port, cause

    @property
    def in_use(self) -> bool:
        return self.errno == errno.EADDRINUSE

    def __str__(self) -> str:
        what = "is already in use by another process" if self.in_use else f"cannot be bound: {self.cause.strerror}"
        return f"the {self.listener} port {self.port} on {self.host} {what}"


def bind_error(host: str, port: int) -> OSError | None:
    """What listening on `host:port` fails with now (None: it would work), learnt by binding it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            probe.listen(1)
        except OSError as exc:
            return exc
    return None


def listen_problem(listener: str, host: str, port: int) -> PortInUse:
    """Why `host:port` could not be listened on (gRPC's own error says only that the bind failed)."""
    cause = bind_error(host, port) or OSError(errno.EADDRINUSE, "taken while it was bound")
    return PortInUse(listener, host, port, cause)


class ControllerServer:
    def __init__(self, settings: ControllerSettings, *, host: str = "127.0.0.1", grpc_port: int = 0,
                 http_port: int = 0, store: Store | None = None, admin_token: str | None = None,
                 read_token: str | None = None, grpc_credentials: grpc.ServerCredentials | None = None,
                 candidate: str | None = None, advertise_address: str | None = None, clock=time.time,
                 http_tls: tuple[str, str] | None = None, quorum_port: int | None = 0,
                 quorum_tls: ssl.SSLContext | None = None, job_secret: JobSecret | None = None) -> None:
        self.settings = settings.validate()
        #: what callers must prove (controller/core/credentials.py); without a job secret
        #: (`--insecure`) a claimed name is believed
        self.credentials = Credentials(job_secret)
        #: the quorum port to bind (0: any free one; None: none), and its TLS (quorum_port.py)
        self.quorum_port, self.quorum_tls = quorum_port, quorum_tls
        #: the quorum port once started (None when there is none)
        self.quorum: QuorumPort | None = None
        #: where coordinators reach the quorum port (in every answer; ":port" means at the host they
        #: reach gRPC at); "" when there is none
        self.quorum_address = ""
        #: (certificate file, key file) for HTTPS on the REST port; None: plain HTTP
        self.http_tls = http_tls
        rule = self.settings.bind_client_cert_to_host
        self.cert_binding = CertBinding(rule).validate() if rule else None
        self.host, self.grpc_port, self.http_port = host, grpc_port, http_port
        self.store: Store = store or MemoryStore()
        self.admin_token, self.read_token = admin_token, read_token
        self.grpc_credentials = grpc_credentials
        self.candidate = candidate or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        #: where clients reach this controller (a standby names the leader's in refusals)
        self.advertise_address = advertise_address or ""
        #: while a standby: the leader's advertised address, as the store last said
        self.leader_address = ""
        self.clock = clock
        #: the core this controller decides with while it leads (None: a standby)
        self.core: ControllerCore | None = None
        self.leading = False
        self.leadership: Leadership | None = None
        self.metrics = Metrics(self)
        self.answers = QuorumAnswers()
        #: replica id -> (future, the quorum id it knows, whether it wants the answer's bytes)
        self.waiters: dict[str, list[tuple[asyncio.Future, int, bool]]] = defaultdict(list)
        self.order_streams: dict[str, asyncio.Queue] = {}
        #: per host without an open stream: only its newest undelivered order (a reconnecting
        #: host is told its current assignment; see HostRegistry.orders_on_connect)
        self.pending_orders: dict[str, OrderOut] = {}
        self.grpc_address = self.http_url = ""
        self.writer = SectionWriter(self)
        self.campaign = Campaign(self)
        self._poke = asyncio.Event()
        self._settle_scheduled = False
        self._settling: set[asyncio.Task] = set()
        #: joins of this pass of the loop, whose Readys the next settle carries out
        self._joins_pending: list[Ready] = []
        self._last_wake: float | None = None
        self._tasks: list[asyncio.Task] = []
        self._grpc: grpc.aio.Server | None = None
        self._http: uvicorn.Server | None = None
        self._health = health.HealthServicer(experimental_non_blocking=True)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every listener and serve; PortInUse (nothing left running) when a port is taken."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        from controller.service.rest import make_app

        # No SO_REUSEPORT (gRPC's default): a second controller on this port must fail, not
        # share it and split the agents between two controllers that each believe they lead.
        self._grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", self.settings.max_request_bytes),
                                              ("grpc.max_send_message_length", self.settings.max_message_bytes),
                                              ("grpc.so_reuseport", 0)])
        servicer = ControllerServicer(self)
        add_to_server(servicer, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        self.set_health(False)
        target = f"{self.host}:{self.grpc_port}"
        if self.grpc_port and bind_error(self.host, self.grpc_port):  # said plainly, before gRPC logs its own
            raise listen_problem("grpc", self.host, self.grpc_port)
        try:
            if self.grpc_credentials is not None:
                port = self._grpc.add_secure_port(target, self.grpc_credentials)
            else:
                port = self._grpc.add_insecure_port(target)
        except RuntimeError:  # gRPC says only "Failed to bind": a plain bind says why
            raise listen_problem("grpc", self.host, self.grpc_port) from None
        await self._grpc.start()
        self.grpc_address = f"{self.host}:{port}"
        # The quorum port's host is the advertised one; without one, coordinators use the host they
        # reach gRPC at (":port": behind a Service, both ports share its name).
        quorum_host = self.advertise_address.rsplit(":", 1)[0] if self.advertise_address else ""
        self.advertise_address = self.advertise_address or self.grpc_address
        # Never a plain quorum port beside a TLS gRPC port: without its SSL context, none.
        if self.quorum_port is not None and (self.grpc_credentials is None or self.quorum_tls is not None):
            self.quorum = QuorumPort(self, servicer, self.quorum_tls)
            try:
                self.quorum_address = f"{quorum_host}:{await self.quorum.start(self.host, self.quorum_port)}"
            except OSError as exc:
                raise PortInUse("quorum", self.host, self.quorum_port, exc) from None

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only: never two listeners
        try:
            sock.bind((self.host, self.http_port))
            sock.listen(2048)  # at once: a bound socket that does not listen yet could be shared
        except OSError as exc:
            sock.close()
            raise PortInUse("http", self.host, self.http_port, exc) from None
        tls = dict(zip(("ssl_certfile", "ssl_keyfile"), self.http_tls)) if self.http_tls else {}
        config = uvicorn.Config(make_app(self), log_level="warning", lifespan="off", access_log=False, **tls)
        self._http = uvicorn.Server(config)
        self._tasks.append(asyncio.create_task(self._http.serve(sockets=[sock]), name="http"))
        self.http_url = f"{'https' if self.http_tls else 'http'}://{self.host}:{sock.getsockname()[1]}"
        self._tasks.append(asyncio.create_task(self.campaign.run(), name="leadership"))
        self._tasks.append(asyncio.create_task(self.campaign.watch_leader(), name="leader-watch"))
        self._tasks.append(asyncio.create_task(trim_freed_memory(), name="freed-memory"))  # issue 28, race 6
        deadline = time.monotonic() + 10
        while not self._http.started and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        log.info("controller %s serving gRPC on %s and HTTP on %s", self.candidate, self.grpc_address, self.http_url)

    async def wait_leading(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.leading:
            if time.monotonic() > deadline:
                raise TimeoutError(f"controller {self.candidate} did not become leader within {timeout_s}s")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        for task in list(self._settling):
            task.cancel()
        self.writer.cancel()
        for task in self._tasks:
            if task.get_name() != "http":
                task.cancel()
        self.step_down("server stopping")
        if self.quorum is not None:
            await self.quorum.stop(self.settings.stop_grace_s)
        if self._grpc is not None:
            await self._grpc.stop(self.settings.stop_grace_s)
        if self._http is not None:
            self._http.should_exit = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.leadership is not None:
            try:
                await asyncio.wait_for(self.store.resign(self.leadership), self.settings.stop_grace_s)
            except (StoreError, asyncio.TimeoutError, OSError):
                log.warning("could not resign leadership cleanly; the lease will expire")
        await self.store.close()

    # -- leadership (controller/service/campaign.py) -----------------------------------------

    def step_down(self, why: str) -> None:
        if not self.leading:
            return
        self.leading = False
        self.leader_address = ""
        self.set_health(False)
        (log.info if why == "server stopping" else log.warning)("controller %s stepped down: %s", self.candidate, why)
        if self.settings.telemetry:  # not persisted: only the leader writes; the next one records its election
            event_log.emit(self.settings.job_id, [Event(
                self.clock(), "leader", self.candidate, f"controller {self.candidate} stepped down: {why}", "",
                "info" if why == "server stopping" else "warning")])
        for rid, waiting in list(self.waiters.items()):
            for fut, *_ in waiting:
                if not fut.done():
                    fut.set_exception(NotLeader(f"controller {self.candidate} stepped down: {why}"))
        self.waiters.clear()
        for q in self.order_streams.values():
            q.put_nowait(None)

    async def load_core(self, for_writing: bool = False) -> ControllerCore:
        """A core started from the last durable snapshot: what a new leader decides with
        (`for_writing`: it remembers the revisions its next writes must match) and what a
        standby shows (its `view`)."""
        sections = ["replicas", "journal"] + [f"hosts/{i}" for i in range(HOST_SHARDS)]
        found = {section: await self.store.get(self.key(section)) for section in sections}
        loaded = {section: json.loads(v.value) if v.value else None for section, v in found.items()}
        for rid in [d["replica_id"] for d in (loaded["replicas"] or {}).get("replicas", ())]:
            section = f"addresses/{rid}"
            found[section] = await self.store.get(self.key(section))
            loaded[section] = json.loads(found[section].value) if found[section].value else None
        addresses = {k.split("/", 1)[1]: v for k, v in loaded.items() if k.startswith("addresses/") and v}
        core = ControllerCore.restored(self.settings, loaded["replicas"], [loaded[s] for s in sections[2:]],
                                       self.clock(), addresses, loaded["journal"])
        if for_writing:
            self.writer.start_leading({section: v.revision for section, v in found.items()})
        return core

    @property
    def state(self) -> ControllerView | None:
        """What the service reads of the leader's state (controller.core.view); it changes only
        through `step`."""
        return self.core.view if self.core is not None else None

    def require_leader(self) -> ControllerView:
        if not self.leading or self.state is None:
            where = f" (at {self.leader_address})" if self.leader_address else ""
            raise NotLeader(f"controller {self.candidate} is a standby; the leader is elsewhere{where}",
                            self.leader_address)
        return self.state

    def set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            self._health.set(name, status)

    def key(self, section: str) -> str:
        return f"jobs/{self.settings.job_id}/{section}"

    # -- the core's steps, carried out -------------------------------------------------------

    def step(self, command) -> Ready:
        """One step of the core (as the leader); its events and observations leave at once,
        and the ticker is moved when the core wants to be woken at another time."""
        self.require_leader()
        ready = self.core.step(command, self.clock())
        self._telemetry(ready)
        if ready.wake_at != self._last_wake:
            self._last_wake = ready.wake_at
            self._poke.set()
        return ready

    def execute(self, ready: Ready, answered: list[tuple[asyncio.Future, int, bool]] = ()):
        """Carry out `ready`: the one place Ready's rule (controller/core/ready.py) is applied.
        What must be durable is written first; only then are the orders delivered and the
        waiting answers sent; then what may follow is written behind. A failed write goes back
        to the core (WriteFailed) and `answered` hear the refusal instead.

        When nothing is to be written and no write is under way or gathering (every round of an
        unchanged quorum id), all of it happens now, in this call, and None comes back.
        Otherwise what is left comes back as a coroutine: the caller awaits it (`apply`: its
        failure is the caller's) or leaves it to run (`submit`). Writes are shared by every
        caller of this pass of the event loop (group commit: 64 registrations or commit
        reports that arrive together cost one write of each section they changed, not 64)."""
        if not (ready.durable_first or self.writer.busy or self.writer.batch_open):
            self._deliver(ready.orders)
            self._answer(answered)
            return self._write_behind(ready.writes_behind) if ready.writes_behind else None
        return self._durable_first(ready, answered)

    async def _durable_first(self, ready: Ready, answered) -> None:
        try:
            # an answer may follow from a write under way, or from one this pass of the loop shares
            await self.writer.write_shared(ready.writes)
        except BaseException as exc:
            if isinstance(exc, SectionsUnwritten) and self.leading:
                self.core.step(WriteFailed(exc.unwritten, ready.orders), self.clock())
            refusal = exc if isinstance(exc, (NotLeader, StoreError)) else NotLeader(f"could not settle: {exc!r}")
            for fut, *_ in answered:
                if not fut.done():
                    fut.set_exception(refusal)
            raise
        self._deliver(ready.orders)
        self._answer(answered)
        if ready.writes_behind:
            await self._write_behind(ready.writes_behind)

    async def _write_behind(self, sections: tuple[str, ...]) -> None:
        try:
            await self.writer.write(sections)
        except SectionsUnwritten as exc:
            if self.leading:
                self.core.step(WriteFailed(exc.unwritten), self.clock())
            raise

    async def apply(self, command):
        """Step, then carry out what the step asks (`execute`); returns the command's answer
        once it may leave (what it follows from is durable)."""
        ready = self.step(command)
        pending = self.execute(ready, self._round_outcome(ready))
        if pending is not None:
            await pending
        return ready.answer

    def submit(self, command) -> Ready:
        """Step, and carry out what the step asks (`execute`) without waiting for it: for
        callers that cannot wait (event loop callbacks, a stream being opened, a takeover).
        Whatever the step asks still follows the rule; a failure is logged."""
        ready = self.step(command)
        pending = self.execute(ready, self._round_outcome(ready))
        if pending is not None:
            self._spawn(pending)
        return ready

    async def settle(self) -> None:
        """Look at the round (it closes if due), and carry out what is pending."""
        await self.apply(CloseRound())

    def _round_outcome(self, ready: Ready) -> list[tuple[asyncio.Future, int, bool]]:
        """The waiting joins `ready`'s quorum answers (not yet answered), after failing the
        waiters dropped from the round. No I/O, no await."""
        answered = []
        q = ready.quorum
        if q is not None:
            self.answers.prepare(q, self.state, self.quorum_address)
            for rid in [m.replica_id for m in q.members]:
                answered.extend(self.waiters.pop(rid, []))
            if ready.quorum_wait_s is not None:
                self.metrics.quorum_latency.observe(ready.quorum_wait_s)
        if ready.round_members is not None:
            for rid in [rid for rid in self.waiters if rid not in ready.round_members]:
                r = self.state.replicas.get(rid)
                reason = r.reason if r is not None else "unknown replica"
                ended = self.state.join_refusal(rid)  # the job ended: said at once, no retry
                for fut, *_ in self.waiters.pop(rid):
                    if not fut.done():
                        fut.set_exception(FailedPrecondition(ended) if ended else
                                          NotLeader(f"replica {rid} was dropped from the round: {reason}"))
        return answered

    def _answer(self, answered: list[tuple[asyncio.Future, int, bool]]) -> None:
        for fut, known, encoded in answered:
            if not fut.done():
                fut.set_result(self.answers.encoded(known) if encoded else self.answers.get(known))

    def _spawn(self, pending) -> None:
        """Run the rest of an `execute` on its own; its failure is logged (the joiners' futures
        carry it to them)."""
        task = asyncio.ensure_future(pending)
        self._settling.add(task)
        task.add_done_callback(self._settled_task)

    def _settled_task(self, task: asyncio.Task) -> None:
        self._settling.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, (NotLeader, StoreError)):
            log.warning("could not carry out a step: %s", exc)
        elif exc is not None:  # a bug must not leave coordinators waiting for ever
            self._settle_failed(exc)

    def join(self, request: JoinRequest, waiter: tuple[asyncio.Future, int, bool]) -> None:
        """Enter a join in the open round; `waiter` (future, the quorum id it knows, whether it
        wants the answer's bytes) is answered by the settle that closes it (`settle_soon`),
        which also carries out what the join asked."""
        ready = self.step(Join(request))
        self.waiters[request.replica_id].append(waiter)
        self._joins_pending.append(ready)
        self.settle_soon()

    def settle_soon(self) -> None:
        """Settle once for every join that arrived in this pass of the event loop: a burst of
        N joins costs one look at the round, not N. The joiners wait on their futures, which
        the settle answers or fails.

        `execute` carries the round out: when nothing must be written before the answers and
        no write is under way (every round of an unchanged quorum id), right in that callback
        (no task, no lock, no further pass of the loop); otherwise a task writes, then answers."""
        if self._settle_scheduled:
            return
        self._settle_scheduled = True

        def start() -> None:
            self._settle_scheduled = False
            joins, self._joins_pending = self._joins_pending, []
            try:
                ready = self.step(CloseRound())
                answered = self._round_outcome(ready)
            except NotLeader as exc:  # stepped down: step_down failed the waiters
                log.warning("could not settle the round: %s", exc)
                return
            except Exception as exc:  # noqa: BLE001 - a bug must not leave coordinators waiting for ever
                self._settle_failed(exc)
                return
            if joins:  # what the joins asked goes with the round's answer (a coordinator's new addresses)
                ready = replace(ready, writes=write_order({w: None for j in joins for w in j.writes} | dict.fromkeys(
                    ready.writes)), orders=tuple(o for j in joins for o in j.orders) + ready.orders)
            pending = self.execute(ready, answered)
            if pending is not None:
                self._spawn(pending)

        asyncio.get_running_loop().call_soon(start)

    def _settle_failed(self, exc: Exception) -> None:
        log.error("settling the round failed: %r", exc, exc_info=exc)
        for waiting in self.waiters.values():
            for fut, *_ in waiting:
                if not fut.done():
                    fut.set_exception(NotLeader(f"the controller could not settle the round: {exc!r}"))

    def forget_waiter(self, replica_id: str, fut: asyncio.Future, why: str) -> None:
        """A Quorum call ended without its answer: its waiter goes, and with the replica's last
        waiter its join leaves the open round (the next settle, on the ticker, says who is
        missing now)."""
        waiting = self.waiters.get(replica_id, [])
        waiting[:] = [w for w in waiting if w[0] is not fut]
        if waiting:
            return
        self.waiters.pop(replica_id, None)
        if self.leading and self.state is not None and self.submit(LeaveRound(replica_id, why)).answer:
            self._poke.set()

    def coordinator_connection_lost(self, replica_id: str, how: str) -> None:
        """A coordinator's connection (`how`) closed without goodbye: the core decides (its replica
        becomes suspect), the next settle closes the round without it if it may."""
        if self.leading and self.state is not None and self.submit(ConnectionLost(replica_id, how)).answer:
            self._poke.set()

    def _deliver(self, orders) -> None:
        for order in orders:
            stream = self.order_streams.get(order.host_id)
            if stream is not None:
                stream.put_nowait(to_proto_order(order))
            else:
                self.pending_orders[order.host_id] = order  # supersedes any older one

    def _telemetry(self, ready: Ready) -> None:
        """Hand new events to the JSON event log and new observations to the histograms."""
        if self.settings.telemetry:
            event_log.emit(self.settings.job_id, ready.events)
            self.metrics.observe(ready.observations)

    def peer_problem(self, context, host_id: str) -> str | None:
        """Why the caller's client certificate may not act as `host_id` (None: it may, or no
        binding is configured)."""
        if self.cert_binding is None:
            return None
        return self.cert_binding.problem(certificate_identities(context), host_id)

    def check_peer_may_act_as(self, context, host_id: str) -> None:
        problem = self.peer_problem(context, host_id)
        if problem:
            raise PermissionDenied(problem)

    async def tick(self) -> None:
        tick_s = min(0.25, self.settings.heartbeat_timeout_s / 10)
        while True:
            wake = self._last_wake  # the last Ready's wake_at
            delay = tick_s if wake is None else min(tick_s, max(wake - self.clock(), 0.001))
            self._poke.clear()
            try:
                await asyncio.wait_for(self._poke.wait(), delay)
            except asyncio.TimeoutError:
                pass
            if not self.leading:
                return
            try:
                await self.apply(Tick())
            except (NotLeader, StoreError) as exc:
                log.warning("tick could not settle: %s", exc)
            except Exception:  # noqa: BLE001 - a bug must not stop the clock: no round would close, no host expire
                log.exception("a tick failed")
