"""A fragment's reduce started in the background (streaming_diloco's overlap) over real FTAR
endpoints in-process: a reduce dropped before it finished leaves no open FTAR join in the
rank's telemetry ring (the agent's hang analysis would read one as a hang), and a finished
reduce signals whoever waits on its handle."""

from __future__ import annotations

import dataclasses
import os
import select

import pytest
import torch

from agent.telemetry import read_ring
from ftar_kernels import FtarEndpoint
from fthsdp.settings import RuntimeSettings
from fthsdp.sync.gradients import GradientSync
from fthsdp.sync.outer import OuterSync
from fthsdp.telemetry import Collectives, Kind, Telemetry
from protos import telemetry_ring as ring
from tests.ftar.cluster import parallel
from tests.runtime.protocol_helpers import plan as make_plan
from tests.runtime.test_shard_sync import SETTINGS

STREAMING = RuntimeSettings(job_id="t", replica_id="0", controller_address="c:1", sync_mode="streaming_diloco",
                            sync_every_steps=4, sync_fragments=2, insecure_trainer_ports=True).validate()


@pytest.fixture
def ring_pair(tmp_path):
    """Two replicas' rank 0 on real endpoints; replica 0's collectives go to a real telemetry ring."""
    eps = [FtarEndpoint.open("127.0.0.1", 0, SETTINGS) for _ in range(2)]
    telemetry = Telemetry.create(tmp_path / "slot-0.ring", replica_id="0", rank=0, now=1.0, capacity=64)
    syncs = [GradientSync(ep, rank=0, world_size=1, timeout_s=5.0,
                          collectives=Collectives(telemetry, 1) if i == 0 else None) for i, ep in enumerate(eps)]
    plan = dataclasses.replace(make_plan(4), ftar_members=tuple(ep.address for ep in eps), quorum_id=7)
    assert parallel(*[lambda s=s: s.configure(plan) for s in syncs]) == [None, None]
    yield syncs, plan, telemetry
    for ep in eps:
        ep.close()
    telemetry.close()


def outer() -> OuterSync:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    o = OuterSync([p for p in model.parameters()], STREAMING, sharded=False)
    o.take_pseudo_gradient(0, keep_local=True)
    return o


def ftar_states(telemetry: Telemetry) -> list[ring.State]:
    _, records = read_ring(telemetry.path)
    return [r.state for r in records if r.kind is Kind.FTAR_ALL_REDUCE]


def test_a_reduce_dropped_before_it_finished_closes_its_ftar_join_in_the_telemetry_ring(ring_pair):
    (mine, _), plan, telemetry = ring_pair
    o = outer()
    assert o.start_reduce(mine, plan, 0) is None  # replica 1 never joins: the all-reduce stays open
    assert ftar_states(telemetry) == [ring.State.JOINED]
    o.drop_reduce(mine)  # a retry in flight
    assert ftar_states(telemetry) == [ring.State.DONE]
    o.drop_reduce(mine)  # nothing pending: nothing more recorded
    assert ftar_states(telemetry) == [ring.State.DONE]


def test_a_finished_reduce_is_closed_once_and_dropping_it_records_nothing_more(ring_pair):
    (mine, theirs), plan, telemetry = ring_pair
    a, b = outer(), outer()
    a.start_reduce(mine, plan, 0), b.start_reduce(theirs, plan, 0)
    results = parallel(lambda: a.poll_reduce(mine, wait=True), lambda: b.poll_reduce(theirs, wait=True))
    assert [r.ok for r in results] == [True, True]
    _, before = read_ring(telemetry.path)
    a.drop_reduce(mine)
    _, after = read_ring(telemetry.path)
    assert [(r.state, r.done_ns) for r in after] == [(r.state, r.done_ns) for r in before]
    assert ftar_states(telemetry) == [ring.State.DONE]
