"""The ring schedule against a naive reference: simulate every rank step by step and compare."""

from __future__ import annotations

import random

import pytest

from ftar_kernels.ring_plan import (
    StepChunks, chunk_ranges, op_schedule, partition_elems, ring_steps, step_chunks,
)


def simulate(inputs: list[list[int]], chunk_elems: int, chunks: int, align: int) -> list[list[int]]:
    """Run the schedule in lock step: at every step each rank sends its send range to the right."""
    world, numel = len(inputs), len(inputs[0])
    data = [list(x) for x in inputs]
    plans = [list(ring_steps(r, world, numel, chunk_elems, chunks, align)) for r in range(world)]
    for t in range(len(plans[0])):
        outgoing = [data[r][slice(*plans[r][t].send)] for r in range(world)]
        for r in range(world):
            st, got = plans[r][t], outgoing[(r - 1) % world]
            assert len(got) == st.recv[1] - st.recv[0]
            lo = st.recv[0]
            for i, v in enumerate(got):
                data[r][lo + i] = data[r][lo + i] + v if st.reduce else v
    return data


@pytest.mark.parametrize("seed", range(40))
def test_random_shapes_sum_like_the_naive_reference(seed):
    rng = random.Random(seed)
    world = rng.randint(2, 6)
    numel = rng.choice([1, 2, world - 1, world, rng.randint(1, 400)])
    chunk_elems, chunks, align = rng.randint(1, 9), rng.randint(1, 4), rng.choice([1, 4, 8])
    inputs = [[rng.randint(-9, 9) for _ in range(numel)] for _ in range(world)]
    want = [sum(col) for col in zip(*inputs)]
    assert simulate(inputs, chunk_elems, chunks, align) == [want] * world


@pytest.mark.parametrize("world,numel", [(2, 1), (3, 100), (4, 1000), (6, 5)])
def test_each_send_waits_for_the_receive_of_the_same_range(world, numel):
    chunk_elems, chunks = 7, 2
    for r in range(world):
        steps = list(ring_steps(r, world, numel, chunk_elems, chunks))
        recvs = [c for st in steps for c in chunk_ranges(*st.recv, chunk_elems, chunks)]
        for ch in (c for sc in step_chunks(steps, chunk_elems, chunks) for c in sc.sends):
            if ch.after_recv >= 0:
                assert recvs[ch.after_recv] == (ch.lo, ch.hi)
        assert len(steps) == 2 * (world - 1) * -(-numel // partition_elems(chunk_elems, chunks, world))


@pytest.mark.parametrize("m,chunk_elems,chunks,align", [
    (1, 16, 2, 4), (5, 16, 4, 4), (100, 16, 2, 4), (64, 32, 2, 8), (4096, 2048, 2, 4), (4099, 2048, 2, 4),
    (3000, 64, 4, 8), (7, 3, 2, 1),
])
def test_chunks_cover_the_segment_in_at_least_c_pieces_of_at_most_s(m, chunk_elems, chunks, align):
    pieces = list(chunk_ranges(10, 10 + m, chunk_elems, chunks, align))
    assert pieces[0][0] == 10 and pieces[-1][1] == 10 + m
    assert all(a < b and b == c for (a, b), (c, _) in zip(pieces, pieces[1:] + [(10 + m, 0)]))
    assert all(b - a <= chunk_elems for a, b in pieces)
    assert len(pieces) >= min(chunks, m // align or 1)
    if m == chunks * chunk_elems:  # a full segment: exactly C chunks of S
        assert len(pieces) == chunks


def test_segments_never_exceed_the_chunk_window_without_alignment():
    for st in ring_steps(1, 4, 10_000, 16, 3):
        assert st.send[1] - st.send[0] <= 16 * 3 and st.recv[1] - st.recv[0] <= 16 * 3


def test_a_single_rank_has_no_steps():
    assert list(ring_steps(0, 1, 100, 8, 2)) == []


class _CreditSource:
    """A right-hand connection that hands out one credit byte per read, and counts reads."""

    def __init__(self) -> None:
        self.reads = 0

    def recv_some(self, into, timeout_s):
        self.reads += 1
        into[0] = 1
        return 1


def test_the_sender_waits_for_credit_only_when_the_window_is_full():
    from ftar_kernels.ring_run import RingLinks

    right = _CreditSource()
    links = RingLinks(left=None, right=right)  # type: ignore[arg-type]
    window = 3
    for sent in range(10):
        links.take_credit(window, timeout_s=1.0)
        assert links.sent_chunks - links.acked_chunks < window  # room for one more chunk
        links.sent_chunks += 1
    assert right.reads == 10 - window  # the first `window` chunks needed no credit


@pytest.mark.parametrize("numel", [1, 599, 600, 601, 5000])
def test_an_operation_schedule_is_its_steps_chunks_kept_only_for_one_partition(numel):
    chunk_elems, chunks, world = 100, 2, 3  # one partition: 600 elements
    for rank in range(world):
        want = list(step_chunks(ring_steps(rank, world, numel, chunk_elems, chunks, 4), chunk_elems, chunks, 4))
        got = op_schedule(rank, world, numel, chunk_elems, chunks, 4)
        assert list(got) == want and all(isinstance(sc, StepChunks) for sc in want)
        if numel <= 600:  # kept: the same tuple the next time
            assert op_schedule(rank, world, numel, chunk_elems, chunks, 4) is got
        else:  # made as the steps are reached, never whole
            assert not isinstance(got, (tuple, list))
