"""FTAR across real processes on loopback: correct sums, identical bytes everywhere, fatal mismatch."""

from __future__ import annotations

import itertools

import pytest

from .cluster import DTYPES, Cluster, expected_sum, tensor_bytes

pytestmark = pytest.mark.slow

CHUNK_BYTES = 4096  # small, so "more than one partition" (chunk x 2 x world) stays cheap
GENERATIONS = itertools.count(1)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(6, chunk_bytes=CHUNK_BYTES, chunks_in_flight=2, timeout_s=10.0, connect_timeout_s=10.0)
    yield c
    c.close()


def configured(cluster: Cluster, world: int) -> list[int]:
    workers = list(range(world))
    answers = cluster.configure(workers, "test/rank0", next(GENERATIONS))
    assert all(a.ok for a in answers), answers
    return workers


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6])
def test_sum_is_exact_and_bitwise_identical_on_every_rank(cluster, world):
    workers = configured(cluster, world)
    # 1 element, fewer elements than ranks, a non-multiple of the chunk, several partitions.
    for numel, dtype in itertools.product([1, 5, 1000, 30001], DTYPES):
        seed = numel * 7 + DTYPES.index(dtype)
        answers = cluster.allreduce(workers, numel, dtype, seed)
        assert all(a.ok for a in answers), (numel, dtype, answers)
        want = tensor_bytes(expected_sum(numel, dtype, seed, world))
        assert {a.value["sha"] for a in answers} == {answers[0].value["sha"]}, (numel, dtype)
        assert answers[0].value["data"] == want, (world, numel, dtype)
        assert all(a.value["bytes"] == len(want) for a in answers)


def test_mismatched_sizes_are_fatal_on_every_rank(cluster):
    workers = configured(cluster, 4)
    answers = cluster.allreduce(workers, 1000, "float32", 1, numels={2: 999})
    assert [a.ok for a in answers] == [False] * 4
    assert {a.value[0] for a in answers} == {"FatalError"}, answers
    assert all("disagree" in a.value[1] for a in answers)


def test_mismatched_dtypes_are_fatal_on_every_rank(cluster):
    workers = configured(cluster, 3)
    for i in workers:
        cluster.send(i, "allreduce", 100, "float16" if i == 1 else "float32", 3, i, 20.0)
    answers = [cluster.answer(i) for i in workers]
    assert {a.value[0] for a in answers if not a.ok} == {"FatalError"} and not any(a.ok for a in answers)


def test_empty_tensors_agree_and_a_mismatch_with_an_empty_one_is_fatal(cluster):
    workers = configured(cluster, 3)
    assert all(a.ok and a.value["bytes"] == 0 for a in cluster.allreduce(workers, 0, "float32", 1))
    answers = cluster.allreduce(workers, 0, "float32", 1, numels={1: 10})
    assert {a.value[0] for a in answers if not a.ok} == {"FatalError"} and not any(a.ok for a in answers)


def test_ring_works_again_after_reconfiguring(cluster):
    workers = configured(cluster, 5)
    answers = cluster.allreduce(workers, 4097, "bfloat16", 11)
    assert all(a.ok for a in answers)
    assert answers[0].value["data"] == tensor_bytes(expected_sum(4097, "bfloat16", 11, 5))
