"""One all-reduce over an established ring: header agreement, then the pipelined data phase.

Two threads per generation: the calling (runner) thread receives from the left neighbour, and
the generation's sender thread (`RingSender`, started once, not per operation) sends to the
right neighbour. In reduce-scatter the receiver folds (adds) what it receives into the tensor as
it arrives, piece by piece (the data plane chooses the pieces: on CPU a cache-sized staging
buffer, on CUDA a whole chunk in a pinned slot); in all-gather it receives straight into the
tensor (CPU) or a pinned slot (CUDA). A chunk counts as received once it is folded, and the
sender forwards a chunk once the chunk it depends on was received: the sender never stops to
fold, so the wire to the right stays busy while the receiver adds. Blocking socket calls
release the GIL, and so does torch's add_.

The runner sends too, as long as that costs no wait that could close a cycle around the ring:
before each step's receives it sends the step's chunks itself while the transport takes each one
at once (`Connection.try_send`) and the credit it needs is owed for an earlier step
(`runner_may_send`); from the first chunk where either fails, the sender thread sends the rest
of the operation. A small all-reduce so runs on the runner alone: no hand-off between threads,
no GIL contention, which on a busy machine cost more than the operation's own work (a 4 KiB
all-reduce took about 1 ms of CPU per rank with a sender thread per operation; see
docs/architecture.md, "FTAR's fixed cost per operation").

Flow control is by credits: the receiver returns one credit byte on the left connection per chunk
it has taken off the wire and folded, and the sender never has more than `chunks_in_flight`
chunks outstanding, so at most S x C bytes are in flight between two neighbours and a staging
slot is written again only after its chunk was folded. Credit counters belong to the connection
and carry over between operations. The first error wins: both connections are interrupted, which
wakes every blocked call on this rank and closes the ring for the neighbours, who then fail too
(RecoverableError).
"""

from __future__ import annotations

import itertools
import threading
from typing import Iterator

from .errors import FatalError, FtarError, RecoverableError
from .handshake import HEADER_BYTES, OpHeader, disagreement
from .protocol_state import RankEvent, RankProtocol
from .ring_plan import SendChunk, op_schedule, partition_elems
from .settings import FtarSettings
from .transport import Connection

CREDIT = b"\x01"


class RingLinks:
    """The two connections of one rank in one generation, and the credit window on the right."""

    def __init__(self, left: Connection, right: Connection) -> None:
        self.left, self.right = left, right
        self.sent_chunks = 0
        self.acked_chunks = 0
        self._credit_buf = memoryview(bytearray(256))

    def take_credit(self, window: int, timeout_s: float) -> None:
        while self.sent_chunks - self.acked_chunks >= window:
            self.acked_chunks += self.right.recv_some(self._credit_buf, timeout_s)

    def interrupt(self) -> None:
        self.left.interrupt()
        self.right.interrupt()

    def close(self) -> None:
        self.left.close()
        self.right.close()


class RingSender:
    """The sending side of one generation's ring: one thread, started with the generation and
    joined when it ends, that sends each operation's chunks to the right neighbour as the
    receiving (runner) thread's progress allows. A thread per operation cost its start, its join
    and their hand-offs on every all-reduce, however small.

    The runner `begin`s an operation, reports each receive chunk folded (`received`), and
    `finish`es it: that waits, bounded, until the sender is idle again and returns the first
    error. The first error (`fail`, from either side) interrupts both connections and is kept:
    the generation is unusable after it, and every later `begin` fails with it."""

    def __init__(self, links: RingLinks, settings: FtarSettings, name: str) -> None:
        self.links = links
        self.window, self.timeout_s = settings.chunks_in_flight, settings.timeout_s
        self.name = name
        self.cond = threading.Condition()
        self.job: tuple | None = None  # (plane, chunks, start, rest) of the operation being sent
        self.recv_done = 0  # receive chunks folded in the operation under way
        self.needed = 0  # the receive count the sender waits for (0: it does not wait for one)
        self.error: BaseException | None = None
        self.stopping = False
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self.thread.start()

    def stop(self) -> bool:
        """End the thread (its connections interrupted or closed first, so a send under way ends
        too); whether it ended within timeout_s + 5 s (it does unless a transport ignores
        interrupt())."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is None:
            return True
        self.thread.join(self.timeout_s + 5.0)
        return not self.thread.is_alive()

    # -- the runner's side

    def begin(self, plane, chunks: Iterator[SendChunk], start: int = 0, rest: memoryview | None = None,
              recv_done: int = 0) -> None:
        """Send `chunks`, the operation's from number `start` on, the first of them only its `rest`
        when the runner sent part of it (its credit taken); `recv_done` receive chunks are folded
        already."""
        with self.cond:
            if self.error is not None:
                raise classify(self.error)
            self.recv_done, self.job = recv_done, (plane, chunks, start, rest)
            self.cond.notify_all()

    def received(self) -> None:
        """One more receive chunk is folded; wakes the sender only if it waits for this one."""
        with self.cond:
            self.recv_done += 1
            if self.needed and self.recv_done >= self.needed:
                self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Keep error if it is the first, and then interrupt both connections."""
        with self.cond:
            first = self.error is None
            if first:
                self.error = error
            self.cond.notify_all()
        if first:
            self.links.interrupt()

    def finish(self) -> BaseException | None:
        """Wait until the operation's last chunk is sent or the sender gave up; the first error."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.job is None, self.timeout_s + 5.0):
                stuck = FatalError("the FTAR sender thread did not stop after its connections were interrupted")
                if self.error is None:
                    self.error = stuck
            return self.error

    # -- the sender thread

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.job is not None or self.stopping)  # idle until stop()
                if self.stopping:
                    return
                job = self.job
            try:
                self._send(*job)
            except BaseException as exc:  # noqa: BLE001 - handed to the runner thread
                self.fail(exc)
            with self.cond:
                self.job = None
                self.cond.notify_all()

    def _send(self, plane, chunks: Iterator[SendChunk], start: int, rest: memoryview | None) -> None:
        links, right, timeout_s = self.links, self.links.right, self.timeout_s
        for i, ch in enumerate(chunks, start):
            if rest is not None:  # the runner sent the start of this chunk
                right.send_all(rest, timeout_s)
                rest = None
            else:
                if ch.after_recv >= 0:
                    self._wait_received(ch.after_recv + 1)
                links.take_credit(self.window, timeout_s)
                right.send_all(plane.send_view(i, ch.lo, ch.hi), timeout_s)
            plane.sent(i)
            links.sent_chunks += 1

    def _wait_received(self, count: int) -> None:
        with self.cond:
            if self.recv_done < count and self.error is None:
                self.needed = count
                done = self.cond.wait_for(lambda: self.recv_done >= count or self.error is not None, self.timeout_s)
                self.needed = 0
                if not done:
                    raise RecoverableError(f"timed out after {self.timeout_s} s waiting for the left neighbour's data")
            if self.error is not None:
                raise RecoverableError("aborted by the receiving side") from self.error


def agree_on_header(links: RingLinks, mine: OpHeader, rank: int, world: int, timeout_s: float) -> None:
    """Pass every rank's header around the ring; FatalError on every rank if any differs."""
    headers: list[OpHeader | None] = [None] * world
    headers[rank] = mine
    links.right.send_all(mine.pack(), timeout_s)
    buf = bytearray(HEADER_BYTES)
    for k in range(1, world):
        links.left.recv_exact(memoryview(buf), timeout_s)
        headers[(rank - k) % world] = OpHeader.unpack(buf)
        if k < world - 1:
            links.right.send_all(bytes(buf), timeout_s)
    problem = disagreement(headers)  # the same list on every rank, so the same verdict
    if problem:
        raise FatalError(problem)


def runner_may_send(sent: int, acked: int, window: int, step_start: int) -> bool:
    """Whether the runner may send the next chunk itself, waiting for its credit if need be: the
    window has room, or the credit is owed for a chunk of an earlier step (`step_start`: chunks
    sent before this step), which the right neighbour returns in its own receives of that step,
    so without waiting for this rank. A credit owed for a chunk of this step comes only once the
    neighbour is past its own sends of it, which may wait on its right neighbour, and so on
    around the ring back to this rank: that wait is the sender thread's, never the runner's."""
    return sent - acked < window or sent - window < step_start


def run_ring(links: RingLinks, sender: RingSender, plane, numel: int, elem_size: int, rank: int, world: int,
             settings: FtarSettings, protocol: RankProtocol) -> None:
    """Move the data of one agreed all-reduce. Raises RecoverableError or FatalError.

    This (runner) thread receives and folds every chunk. It also sends, step by step before that
    step's receives, as long as the transport takes each chunk at once and the credit a chunk
    needs is owed for a chunk of an earlier step: so it never waits on the right neighbour for
    anything the neighbour could only give after this rank's own receives (no cycle around the
    ring). At the first chunk for which either fails, the rest of the operation's sends go to
    `sender`, the generation's sender thread. A small all-reduce thus runs on one thread, with no
    hand-off; a large one moves to the two-thread pipeline within its first chunks."""
    chunk_elems = settings.chunk_bytes // elem_size
    chunks = settings.chunks_in_flight
    align = max(1, 16 // elem_size)
    n_parts = -(-numel // partition_elems(chunk_elems, chunks, world))
    timeout_s, right = settings.timeout_s, links.right
    handed = False  # whether the sender thread has the rest of the sends

    def sends_from(i: int) -> Iterator[SendChunk]:
        return itertools.islice((ch for sc in op_schedule(rank, world, numel, chunk_elems, chunks, align)
                                 for ch in sc.sends), i, None)

    try:
        i, k, partition = 0, 0, 0  # next send chunk, next receive chunk, partition
        for sc in op_schedule(rank, world, numel, chunk_elems, chunks, align):
            st = sc.step
            if st.step == world - 1:
                protocol.apply(RankEvent.SCATTERED)
            step_start = links.sent_chunks
            for ch in sc.sends if not handed else ():
                if not runner_may_send(links.sent_chunks, links.acked_chunks, chunks, step_start):
                    sender.begin(plane, sends_from(i), i, None, k)
                    handed = True
                    break
                links.take_credit(chunks, timeout_s)
                view = plane.send_view(i, ch.lo, ch.hi)
                taken = right.try_send(view)
                if taken < len(view):
                    sender.begin(plane, sends_from(i), i, view[taken:], k)
                    handed = True
                    break
                plane.sent(i)
                links.sent_chunks += 1
                i += 1
            for lo, hi in sc.recvs:
                # The receiver folds what it received at once, piece by piece (on CPU a piece
                # small enough to be added while it is still in cache), so the sender never
                # stops sending to fold, and a chunk is complete when it is folded.
                for a, b in plane.pieces(lo, hi, st.reduce):
                    links.left.recv_exact(plane.recv_view(k, a, b, st.reduce), timeout_s)
                    plane.received(k, a, b, st.reduce)
                try:
                    links.left.send_all(CREDIT, timeout_s)
                except RecoverableError:
                    # The left neighbour stopped reading. If it still owes us data, the next
                    # receive fails; if not (it finished and moved on), this op is unaffected.
                    pass
                if handed:
                    sender.received()
                k += 1
            if st.last_of_partition:
                partition += 1
                if partition < n_parts:
                    protocol.apply(RankEvent.NEXT_PARTITION)
    except BaseException as exc:  # noqa: BLE001
        sender.fail(exc)
    error = sender.finish()
    if error is not None:
        raise classify(error)
    protocol.apply(RankEvent.GATHERED)  # every chunk sent, received and folded


def classify(error: BaseException) -> FtarError:
    """Our errors keep their kind; anything else (a kernel, a driver, a bug) is fatal."""
    if isinstance(error, FtarError):
        return error
    return FatalError(f"local failure during all-reduce: {error!r}")
