"""One all-reduce over an established ring: header agreement, then the pipelined data phase.

Two threads per operation: the calling (runner) thread receives from the left neighbour, and a
sender thread sends to the right neighbour. In reduce-scatter the receiver folds (adds) what it
receives into the tensor as it arrives, piece by piece (the data plane chooses the pieces: on CPU
a cache-sized staging buffer, on CUDA a whole chunk in a pinned slot); in all-gather it receives
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
from .ring_plan import chunk_ranges, partition_elems, ring_steps, send_chunks
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


class _Progress:
    """How many receive chunks are finished, and the first error of the operation."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.recv_done = 0
        self.error: BaseException | None = None

    def advance(self) -> None:
        with self.cond:
            self.recv_done += 1
            self.cond.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.recv_done >= count or self.error is not None, timeout_s):
                raise RecoverableError(f"timed out after {timeout_s} s waiting for the left neighbour's data")
            if self.error is not None:
                raise RecoverableError("aborted by the receiving side") from self.error

    def fail(self, error: BaseException) -> bool:
        """Record error if it is the first; return whether it was."""
        with self.cond:
            first = self.error is None
            if first:
                self.error = error
            self.cond.notify_all()
            return first


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


def run_ring(links: RingLinks, plane, numel: int, elem_size: int, rank: int, world: int,
             settings: FtarSettings, protocol: RankProtocol) -> None:
    """Move the data of one agreed all-reduce. Raises RecoverableError or FatalError."""
    chunk_elems = settings.chunk_bytes // elem_size
    chunks = settings.chunks_in_flight
    align = max(1, 16 // elem_size)
    n_parts = -(-numel // partition_elems(chunk_elems, chunks, world))
    progress = _Progress()

    def fail(error: BaseException) -> None:
        if progress.fail(error):
            links.interrupt()

    def send_loop() -> None:
        try:
            steps = ring_steps(rank, world, numel, chunk_elems, chunks, align)
            for i, ch in enumerate(send_chunks(steps, chunk_elems, chunks, align)):
                if ch.after_recv >= 0:
                    progress.wait_for(ch.after_recv + 1, settings.timeout_s)
                links.take_credit(chunks, settings.timeout_s)
                links.right.send_all(plane.send_view(i, ch.lo, ch.hi), settings.timeout_s)
                plane.sent(i)
                links.sent_chunks += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the runner thread
            fail(exc)

    sender = threading.Thread(target=send_loop, name=f"ftar-send-r{rank}", daemon=True)
    sender.start()
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
                    links.left.recv_exact(plane.recv_view(k, a, b, st.reduce), settings.timeout_s)
                    plane.received(k, a, b, st.reduce)
                try:
                    links.left.send_all(CREDIT, settings.timeout_s)
                except RecoverableError:
                    # The left neighbour stopped reading. If it still owes us data, the next
                    # receive fails; if not (it finished and moved on), this op is unaffected.
                    pass
                progress.advance()
                k += 1
            if st.last_of_partition:
                partition += 1
                if partition < n_parts:
                    protocol.apply(RankEvent.NEXT_PARTITION)
    except BaseException as exc:  # noqa: BLE001
        fail(exc)
    sender.join(settings.timeout_s + 5.0)
    if sender.is_alive():  # only if a transport ignores interrupt()
        fail(FatalError("the FTAR sender thread did not stop after its connections were interrupted"))
    if progress.error is not None:
        raise classify(progress.error)
    protocol.apply(RankEvent.GATHERED)  # every chunk sent, received and folded


def classify(error: BaseException) -> FtarError:
    """Our errors keep their kind; anything else (a kernel, a driver, a bug) is fatal."""
    if isinstance(error, FtarError):
        return error
    return FatalError(f"local failure during all-reduce: {error!r}")
