"""The ring schedule as pure arithmetic: which element ranges a rank sends and receives, in order.

The tensor (numel elements) is cut into partitions of at most chunk_elems * chunks * world
elements. Each partition is cut into `world` segments, and each segment into `chunks` near-equal
chunks of at most chunk_elems (more only when alignment needs the room). Per partition there are 2(world-1)
steps: world-1 reduce-scatter steps then world-1 all-gather steps. At step t rank r

    reduce-scatter (t < world-1):   sends segment (r - t), receives (r - t - 1) and adds it in
    all-gather     (s = t-world+1): sends segment (r + 1 - s), receives (r - s) and copies it in

(indices mod world). The segment sent at step t is the one received at step t-1, so the sender's
chunk j of step t waits for the receiver's chunk j of step t-1 (`SendChunk.after_recv`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Iterator


@dataclass(frozen=True)
class Step:
    partition: int
    step: int  # 0 .. 2(world-1)-1 within the partition
    reduce: bool  # True in reduce-scatter, False in all-gather
    last_of_partition: bool
    send: tuple[int, int]  # element range [lo, hi)
    recv: tuple[int, int]


@dataclass(frozen=True)
class SendChunk:
    lo: int
    hi: int
    after_recv: int  # index of the receive chunk that must finish first, or -1


def partition_elems(chunk_elems: int, chunks: int, world: int) -> int:
    return chunk_elems * chunks * world


def segment_bounds(lo: int, hi: int, world: int, align_elems: int) -> list[int]:
    """world+1 boundaries splitting [lo, hi) as evenly as possible, inner ones aligned."""
    m = hi - lo
    inner = [lo + ((i * m) // world) // align_elems * align_elems for i in range(1, world)]
    return [lo, *inner, hi]


def ring_steps(rank: int, world: int, numel: int, chunk_elems: int, chunks: int,
               align_elems: int = 1) -> Iterator[Step]:
    """Every step of the whole operation for `rank`, partition by partition."""
    if world < 2:
        return
    size = partition_elems(chunk_elems, chunks, world)
    last = 2 * (world - 1) - 1
    for p, lo in enumerate(range(0, numel, size)):
        b = segment_bounds(lo, min(numel, lo + size), world, align_elems)

        def seg(i: int) -> tuple[int, int]:
            i %= world
            return b[i], b[i + 1]

        for t in range(last + 1):
            if t < world - 1:
                yield Step(p, t, True, t == last, seg(rank - t), seg(rank - t - 1))
            else:
                s = t - (world - 1)
                yield Step(p, t, False, t == last, seg(rank + 1 - s), seg(rank - s))


def chunk_ranges(lo: int, hi: int, chunk_elems: int, chunks: int = 1, align_elems: int = 1
                 ) -> Iterator[tuple[int, int]]:
    """Cut a segment into at least `chunks` near-equal, non-empty pieces of at most chunk_elems.

    Equal pieces rather than full chunks plus a remainder keep the pipeline `chunks` deep even for
    segments smaller than chunks x chunk_elems. Inner boundaries are aligned to align_elems (16
    bytes, for the CUDA kernel's vector loads)."""
    m = hi - lo
    if m <= 0:
        return
    n = max(chunks, -(-m // chunk_elems))
    while True:  # one more piece if aligning the boundaries made one too long (rare)
        bounds = [lo, *(lo + ((i * m) // n) // align_elems * align_elems for i in range(1, n)), hi]
        if n >= m or all(b - a <= chunk_elems for a, b in zip(bounds, bounds[1:])):
            break
        n += 1
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            yield a, b


@dataclass(frozen=True)
class StepChunks:
    """One step of a rank's schedule cut into chunks: what it sends (each send naming the receive
    chunk it depends on) and what it receives, in order."""

    step: Step
    sends: tuple[SendChunk, ...]
    recvs: tuple[tuple[int, int], ...]


def step_chunks(steps: list[Step] | Iterator[Step], chunk_elems: int, chunks: int = 1,
                align_elems: int = 1) -> Iterator[StepChunks]:
    """Every step with its chunks; receive chunks are numbered across the whole operation."""
    recv_start = 0  # global index of the first receive chunk of the current step
    prev_recv_start = 0
    for st in steps:
        sends = tuple(SendChunk(lo, hi, -1 if st.step == 0 else prev_recv_start + j)
                      for j, (lo, hi) in enumerate(chunk_ranges(*st.send, chunk_elems, chunks, align_elems)))
        recvs = tuple(chunk_ranges(*st.recv, chunk_elems, chunks, align_elems))
        yield StepChunks(st, sends, recvs)
        prev_recv_start, recv_start = recv_start, recv_start + len(recvs)


def op_schedule(rank: int, world: int, numel: int, chunk_elems: int, chunks: int = 1,
                align_elems: int = 1) -> Iterable[StepChunks]:
    """`step_chunks` of one operation. A tensor of one partition (at most 2(world-1) steps of about
    `chunks` chunks each) gets its schedule from a small cache, so an all-reduce of a size seen
    before spends nothing on it; a larger one's steps are made as they are reached, so its
    schedule never sits whole in memory."""
    if numel <= partition_elems(chunk_elems, chunks, world):
        return _one_partition(rank, world, numel, chunk_elems, chunks, align_elems)
    return step_chunks(ring_steps(rank, world, numel, chunk_elems, chunks, align_elems), chunk_elems, chunks,
                       align_elems)


@functools.lru_cache(maxsize=32)
def _one_partition(rank: int, world: int, numel: int, chunk_elems: int, chunks: int,
                   align_elems: int) -> tuple[StepChunks, ...]:
    return tuple(step_chunks(ring_steps(rank, world, numel, chunk_elems, chunks, align_elems), chunk_elems, chunks,
                             align_elems))
