"""Gradient shards across replicas (the FSDP2 hook's other end) over real FTAR endpoints in-process.

Two replicas' rank 0, each a GradientSync on its own FtarEndpoint: shards go in as FSDP2's
hook hands them over (deferred or not), come out summed over the contributors and divided
by their number; 16-bit shards add in float32 and are rounded once; a behind replica adds
zeros; a failure turns into a "no" vote and nothing waits unbounded.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ftar_kernels import FtarEndpoint, FtarSettings
from fthsdp.sync.gradients import GradientSync
from protos import job_secret
from tests.ftar.cluster import parallel
from tests.runtime.protocol_helpers import plan as make_plan
from tests.trainer_secret import SECRET

SETTINGS = FtarSettings(chunk_bytes=4096, chunks_in_flight=2, timeout_s=5.0, connect_timeout_s=5.0,
                        auth_key=SECRET.key(job_secret.PURPOSE_FTAR))


@pytest.fixture
def pair():
    eps = [FtarEndpoint.open("127.0.0.1", 0, SETTINGS) for _ in range(2)]
    syncs = [GradientSync(ep, rank=0, world_size=1, timeout_s=5.0) for ep in eps]
    members = tuple(ep.address for ep in eps)
    plans = [dataclasses.replace(make_plan(4), ftar_members=members, quorum_id=7) for _ in eps]
    assert parallel(*[lambda s=s, p=p: s.configure(p) for s, p in zip(syncs, plans)]) == [None, None]
    yield syncs, plans
    for ep in eps:
        ep.close()


def _shards(dtype: torch.dtype, seed: int, sizes=(1000, 37, 5000)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for n in sizes]


def _run(syncs, plans, inputs, deferred=True):
    """Each replica hands its shards to its sync in order (as backward would), then waits."""
    def replica(k):
        for shard in inputs[k]:
            syncs[k].reduce_shard_(shard, plans[k], deferred)
        return syncs[k].wait_shards(plans[k])
    return parallel(lambda: replica(0), lambda: replica(1))


@pytest.mark.parametrize("deferred", [True, False])
def test_float32_shards_are_averaged_in_place_bitwise_equal_on_both_replicas(pair, deferred):
    syncs, plans = pair
    inputs = [_shards(torch.float32, 0), _shards(torch.float32, 1)]
    expected = [(a + b) / 2 for a, b in zip(*inputs)]
    results = _run(syncs, plans, inputs, deferred)
    assert [r.ok for r in results] == [True, True], results
    for a, b, want in zip(*inputs, expected):
        assert torch.equal(a, want) and torch.equal(b, want)  # in place, same bytes on both


def test_bfloat16_shards_accumulate_in_float32_and_round_once(pair):
    syncs, plans = pair
    inputs = [_shards(torch.bfloat16, 2), _shards(torch.bfloat16, 3)]
    expected = [((a.float() + b.float()) / 2).to(torch.bfloat16) for a, b in zip(*inputs)]
    results = _run(syncs, plans, inputs)
    assert all(r.ok for r in results), results
    for a, b, want in zip(*inputs, expected):
        assert a.dtype == torch.bfloat16 and torch.equal(a, want) and torch.equal(b, want)


def test_a_behind_replica_contributes_zeros_and_gets_the_healthy_average(pair):
    syncs, plans = pair
    plans = [dataclasses.replace(plans[0], included=("a",), divisor=1), dataclasses.replace(
        plans[1], behind=True, included=("a",), divisor=1)]
    inputs = [_shards(torch.float32, 4), _shards(torch.float32, 5)]
    healthy = [t.clone() for t in inputs[0]]
    results = _run(syncs, plans, inputs)
    assert all(r.ok for r in results), results
    for a, b, want in zip(*inputs, healthy):
        assert torch.equal(a, want) and torch.equal(b, want)  # the behind replica's gradient is gone


def test_no_plan_or_no_shard_votes_no_with_the_reason(pair):
    syncs, plans = pair
    shard = torch.ones(8)
    syncs[0].reduce_shard_(shard, None, True)
    result = syncs[0].wait_shards(None)
    assert not result.ok and "no plan" in result.reason and torch.equal(shard, torch.ones(8))
    result = syncs[0].wait_shards(plans[0])
    assert not result.ok and "no gradient shard reached the all-reduce hook" in result.reason


def test_a_replica_that_vanishes_mid_backward_makes_the_other_vote_no_in_bounded_time(pair):
    syncs, plans = pair
    inputs = _shards(torch.float32, 6)
    syncs[1].endpoint.close()  # replica 1 died after the ring was built
    for shard in inputs:
        syncs[0].reduce_shard_(shard, plans[0], True)
    result = syncs[0].wait_shards(plans[0])
    assert not result.ok and "FTAR all-reduce of step 4 failed" in result.reason
    # the ring is marked broken: the next shard is not sent into it, and the vote stays no
    syncs[0].reduce_shard_(torch.ones(4), plans[0], False)
    again = syncs[0].wait_shards(plans[0])
    assert not again.ok and "failed" in again.reason
