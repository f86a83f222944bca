"""FtarEndpoint: the public face of FTAR for one rank of one ring.

    ep = FtarEndpoint(host="127.0.0.1", port=0, settings=FtarSettings(auth_key=KEY))  # binds, listens, no threads
    ep.configure("job1/rank3", generation=17, members=[...])  # starts the acceptor on first call
    stats = ep.allreduce(tensor).wait()
    ep.close()

Threads: one acceptor per endpoint (from the first configure to close), and per configured
generation of more than one member a runner (executes queued all-reduces in order, receiving
and folding) and a sender (`RingSender`: sends each one's chunks). All are joined by configure
(the old generation's) and close.

On failure the tensor's contents are unspecified (partly summed) if data had started to move;
failures before that (invalid arguments, header disagreement, not configured, cancelled queued
work) leave the tensor untouched. Callers drop the step's gradients on any error anyway.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import torch

from .data_plane_cpu import CpuDataPlane
from .errors import FatalError, FtarError, NotReady, RecoverableError
from .handshake import DTYPE_CODES, OpHeader
from .membership import Membership
from .op_handle import AllReduceHandle, OpStats
from .protocol_state import IllegalTransition, RankEvent, RankProtocol, RankState
from .ring_run import RingLinks, RingSender, agree_on_header, classify, run_ring
from .settings import FtarSettings
from .transport import TcpTransport, Transport

log = logging.getLogger("ftar_kernels")
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class _Op:
    tensor: torch.Tensor
    handle: AllReduceHandle
    sequence: int
    ready: object = None  # torch.cuda.Event on the caller's stream, for CUDA tensors


class _Session:
    """One configured generation: its links, its queue, the runner thread that drains it and the
    sender thread that sends for it."""

    def __init__(self, endpoint: "FtarEndpoint", links: RingLinks | None, rank: int, world: int,
                 generation: int) -> None:
        self.endpoint, self.links = endpoint, links
        self.sender = None if links is None else RingSender(links, endpoint.settings, f"ftar-send-g{generation}")
        self.rank, self.world, self.generation = rank, world, generation
        self.cond = threading.Condition()
        self.queue: collections.deque[_Op] = collections.deque()
        self.broken: FtarError | None = None
        self.stopping = False
        self.sequence = 0
        self.thread: threading.Thread | None = None
        self.registered: set[int] = set()  # data planes whose buffers the links have registered

    def start(self) -> None:
        if self.sender is not None:
            self.sender.start()
        self.thread = threading.Thread(target=self._run, name=f"ftar-run-g{self.generation}", daemon=True)
        self.thread.start()

    def submit(self, tensor: torch.Tensor, ready) -> AllReduceHandle:
        with self.cond:
            if self.broken is not None or self.stopping:
                return AllReduceHandle.failed(RecoverableError(
                    f"generation {self.generation} can no longer all-reduce "
                    f"({self.broken or 'reconfiguring'}); reconfigure first"))
            handle = AllReduceHandle()
            self.queue.append(_Op(tensor, handle, self.sequence, ready))
            self.sequence += 1
            self.cond.notify_all()
            return handle

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue or self.stopping)
                if self.stopping:
                    return
                op = self.queue.popleft()
            try:
                op.handle._succeed(self.endpoint._execute(self, op))
            except BaseException as exc:  # noqa: BLE001 - every error goes to the handle
                error = classify(exc)
                self._break(error)
                op.handle._fail(error)

    def _break(self, error: FtarError) -> None:
        """Mark this generation unusable and cancel everything queued."""
        if self.links is not None:
            self.links.interrupt()
        with self.cond:
            first = self.broken is None and not self.stopping
            if self.broken is None:
                self.broken = error
            cancelled, self.queue = list(self.queue), collections.deque()
        if first:
            log.warning("%s generation %d aborted (%s): %s", self.endpoint.address, self.generation,
                        type(error).__name__, error)
        for op in cancelled:
            op.handle._fail(RecoverableError(f"cancelled: an earlier all-reduce failed: {error}"))

    def shutdown(self, reason: str) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._break(RecoverableError(reason))
        bound = self.endpoint.settings.timeout_s + 5.0  # each of its waits is at most timeout_s
        if self.thread is not None:
            self.thread.join(bound)
            if self.thread.is_alive():  # only if a transport ignores interrupt() and its read timeouts
                log.warning("%s generation %d: the runner thread did not stop within %s s; left behind",
                            self.endpoint.address, self.generation, bound)
        if self.sender is not None and not self.sender.stop():  # only if a transport ignores interrupt()
            log.warning("%s generation %d: the sender thread did not stop within %s s", self.endpoint.address,
                        self.generation, bound)
        if self.links is not None:
            self.links.close()


class FtarEndpoint:
    """One rank's FTAR endpoint. Binds and listens in __init__; starts no thread there."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, settings: FtarSettings | None = None,
                 transport: Transport | None = None) -> None:
        self.settings = (settings or FtarSettings()).validate()
        self._transport = transport or TcpTransport(self.settings.socket_buffer_bytes)
        self._membership = Membership(self._transport.listen(host, port), self._transport,
                                      self.settings.connect_timeout_s, self.settings.auth_key or None)
        self.address: str = self._membership.address
        self.protocol = RankProtocol()
        self._lock = threading.RLock()  # serialises configure / close
        self._session: _Session | None = None
        self._generation: int | None = None
        self._submit_lock = threading.Lock()  # a submit sees the table and the session together
        self._planes: dict[object, object] = {}

    @classmethod
    def open(cls, host: str = "127.0.0.1", port: int = 0, settings: FtarSettings | None = None,
             transport: Transport | None = None) -> "FtarEndpoint":
        """An endpoint whose acceptor already runs (configure() also starts it when needed)."""
        endpoint = cls(host, port, settings, transport)
        endpoint._membership.start()
        return endpoint

    @property
    def generation(self) -> int | None:
        return self._generation

    def configure(self, group_id: str, generation: int, members: list[str]) -> None:
        """Build the ring for `members` (addresses in ring order, including self.address).

        Blocks at most connect_timeout_s. Closes the previous generation's connections and
        cancels its queued work first. RecoverableError if a neighbour cannot be reached or
        refuses; FatalError for invalid arguments (including a generation older than the
        current one)."""
        members = list(members)
        self._check_membership(group_id, generation, members)
        with self._lock:
            with self._submit_lock:  # no all-reduce reaches the old session once it is dropped
                self._drop_session(f"reconfiguring to generation {generation}")
                self.protocol.apply(RankEvent.CONFIGURE)  # IllegalTransition once closed
            self._generation = generation
            self._membership.start()
            self._membership.advance(group_id, generation)
            rank, world = members.index(self.address), len(members)
            links = None
            if world > 1:
                try:
                    links = self._membership.connect_ring(
                        group_id, generation, members[(rank - 1) % world], members[(rank + 1) % world])
                except BaseException:  # any failure leaves CONNECTING, so the next configure may run
                    self.protocol.apply(RankEvent.FAIL)
                    raise
            session = _Session(self, links, rank, world, generation)
            session.start()
            with self._submit_lock:
                self.protocol.apply(RankEvent.CONNECTED)
                self._session = session
            log.info("%s configured %r generation %d as ring position %d of %d",
                     self.address, group_id, generation, rank, world)

    def _check_membership(self, group_id: str, generation: int, members: list[str]) -> None:
        if not isinstance(group_id, str) or not group_id:
            raise FatalError(f"group_id must be a non-empty string, got {group_id!r}.")
        if not isinstance(generation, int) or generation < 0:
            raise FatalError(f"generation must be a non-negative integer, got {generation!r}.")
        if self._generation is not None and generation < self._generation:
            raise FatalError(f"generation {generation} is older than the current generation "
                             f"{self._generation}; generations must not decrease.")
        if self.address not in members:
            raise FatalError(f"members {members!r} do not include this endpoint's address {self.address!r}.")
        if len(set(members)) != len(members):
            raise FatalError(f"members {members!r} name some address more than once.")

    def allreduce(self, tensor: torch.Tensor) -> AllReduceHandle:
        """Start an in-place SUM of `tensor` over the group; returns at once.

        FatalError at once for an invalid tensor. Otherwise errors arrive through handle.wait()."""
        if not isinstance(tensor, torch.Tensor):
            raise FatalError(f"allreduce needs a torch.Tensor, got {type(tensor).__name__}.")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise FatalError(f"allreduce supports float32, bfloat16 and float16, got {tensor.dtype}.")
        if tensor.device.type not in ("cpu", "cuda"):
            raise FatalError(f"allreduce supports CPU and CUDA tensors, got device {tensor.device}.")
        ready = None
        if tensor.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(tensor.device))
        with self._submit_lock:
            try:
                self.protocol.apply(RankEvent.SUBMIT)
            except IllegalTransition as exc:
                return AllReduceHandle.failed(NotReady(self.address, exc.state, self._generation))
            return self._session.submit(tensor.detach(), ready)

    def _execute(self, session: _Session, op: _Op) -> OpStats:
        """Run one queued operation on the session's runner thread."""
        started = time.perf_counter()
        tensor = op.tensor
        nbytes = tensor.numel() * tensor.element_size()
        self.protocol.apply(RankEvent.START)  # only CONFIGURED or DONE start; a bug otherwise
        if session.world > 1:
            header = OpHeader(session.generation, op.sequence, tensor.numel(),
                              DTYPE_CODES[str(tensor.dtype).removeprefix("torch.")])
            try:
                agree_on_header(session.links, header, session.rank, session.world, self.settings.timeout_s)
            except BaseException:
                self.protocol.apply(RankEvent.FAIL)
                raise
        if session.world == 1 or tensor.numel() == 0:
            self.protocol.apply(RankEvent.SCATTERED)
            self.protocol.apply(RankEvent.GATHERED)
            return OpStats(bytes=nbytes, seconds=time.perf_counter() - started)
        try:
            work = tensor if tensor.is_contiguous() else tensor.contiguous()
            flat = work.view(-1)
            plane = self._plane_for(flat)
            if id(plane) not in session.registered:  # a no-op for TCP; RDMA would pin buffers here
                plane.register(session.links.left)
                plane.register(session.links.right)
                session.registered.add(id(plane))
            sent_before = session.links.sent_chunks
            plane.begin(flat, op.ready) if flat.is_cuda else plane.begin(flat)
            try:
                run_ring(session.links, session.sender, plane, flat.numel(), flat.element_size(), session.rank,
                         session.world, self.settings, self.protocol)
            finally:
                plane.finish()
            if work is not tensor:
                tensor.copy_(work)
                if tensor.is_cuda:
                    torch.cuda.current_stream(tensor.device).synchronize()
        except BaseException:
            self.protocol.apply(RankEvent.FAIL)
            raise
        wire = nbytes * 2 * (session.world - 1) // session.world
        return OpStats(bytes=nbytes, seconds=time.perf_counter() - started, wire_bytes=wire,
                       chunks=session.links.sent_chunks - sent_before)

    def _plane_for(self, flat: torch.Tensor):
        key = flat.device
        plane = self._planes.get(key)
        if plane is None:
            if flat.is_cuda:
                from .data_plane_cuda import CudaDataPlane  # lazy: CuPy only for CUDA tensors

                plane = CudaDataPlane(self.settings.chunk_bytes, self.settings.chunks_in_flight, flat.device,
                                      self.settings.cuda_blocks, self.settings.cuda_threads_per_block)
            else:
                plane = CpuDataPlane(self.settings.chunk_bytes, self.settings.cpu_fold_bytes)
            self._planes[key] = plane
        return plane

    def _drop_session(self, reason: str) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.shutdown(reason)

    @property
    def state(self) -> RankState:
        return self.protocol.state

    def close(self) -> None:
        """Idempotent: cancel queued work, join every thread, close every socket."""
        with self._lock:
            with self._submit_lock:
                if self.protocol.state is RankState.CLOSED:
                    return
                self._drop_session("endpoint closed")
                self.protocol.apply(RankEvent.CLOSE)
            self._membership.stop()
            self._planes.clear()

    def __enter__(self) -> "FtarEndpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
