"""One all-reduce over an established ring: header agreement, then the pipelined data phase.

Two threads per generation: the calling (runner) thread receives from the left neighbour, and
the generation's sender thread (`RingSender`, started once, not per operation) sends to the right
neighbour. In reduce-scatter the receiver folds (adds) what it receives into the tensor as it
arrives, piece by piece (the data plane chooses the pieces: on CPU a cache-sized staging
buffer, on CUDA a whole chunk in a pinned slot); in all-gather it receives
straight into the tensor (CPU) or a pinned slot (CUDA). A chunk counts as received once it is
folded, and the sender forwards a chunk once the chunk it depends on was received: the sender
never stops to fold, so the wire to the right stays busy while the receiver adds. Blocking socket
calls release the GIL, and so does torch's add_.

Flow control is by credits: the receiver returns one credit byte on the left connection per chunk
it has taken off the wire and folded, and the sender never has more than `chunks_in_flight`
chunks outstanding, so at most S x C bytes are in flight between two neighbours and a staging
slot is written again only after its chunk was folded. Credit counters belong to the connection
and carry over between operations. The first error wins: both connections are interrupted, which
wakes every blocked call on this rank and closes the ring for the neighbours, who then fail too
(RecoverableError).
"""

from __future__ import annotations

import threading

from .errors import FatalError, FtarError, RecoverableError
from .handshake import HEADER_BYTES, OpHeader, disagreement
from .protocol_state import RankEvent, RankProtocol
from .ring_plan import SendChunk, chunk_ranges, partition_elems, ring_steps, send_chunks
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
        self.job: tuple[object, list[SendChunk]] | None = None  # (plane, chunks) of the operation being sent
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
        too); whether it ended within timeout_s + 5 s (it does unless a transport ignores interrupt())."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is None:
            return True
        self.thread.join(self.timeout_s + 5.0)
        return not self.thread.is_alive()

    # -- the runner's side

    def begin(self, plane, chunks: list[SendChunk]) -> None:
        with self.cond:
            if self.error is not None:
                raise classify(self.error)
            self.recv_done, self.job = 0, (plane, chunks)
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
                plane, chunks = self.job
            try:
                self._send(plane, chunks)
            except BaseException as exc:  # noqa: BLE001 - handed to the runner thread
                self.fail(exc)
            with self.cond:
                self.job = None
                self.cond.notify_all()

    def _send(self, plane, chunks: list[SendChunk]) -> None:
        links, right, timeout_s = self.links, self.links.right, self.timeout_s
        for i, ch in enumerate(chunks):
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


def run_ring(links: RingLinks, sender: RingSender, plane, numel: int, elem_size: int, rank: int, world: int,
             settings: FtarSettings, protocol: RankProtocol) -> None:
    """Move the data of one agreed all-reduce: this (runner) thread receives and folds, `sender`
    sends. Raises RecoverableError or FatalError."""
    chunk_elems = settings.chunk_bytes // elem_size
    chunks = settings.chunks_in_flight
    align = max(1, 16 // elem_size)
    n_parts = -(-numel // partition_elems(chunk_elems, chunks, world))
    timeout_s = settings.timeout_s
    sender.begin(plane, list(send_chunks(ring_steps(rank, world, numel, chunk_elems, chunks, align),
                                         chunk_elems, chunks, align)))
    try:
        k, partition = 0, 0
        for st in ring_steps(rank, world, numel, chunk_elems, chunks, align):
            if st.step == world - 1:
                protocol.apply(RankEvent.SCATTERED)
            for lo, hi in chunk_ranges(*st.recv, chunk_elems, chunks, align):
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
