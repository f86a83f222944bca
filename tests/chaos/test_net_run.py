"""A small job on its own network (tests/chaos/network.py): etcd, two controllers and each
host in a namespace of its own, real agents and trainers; network faults carried out for real
(tests/chaos/net_kinds.py), then every chaos invariant checked (tests/chaos/invariants.py),
"no two leaders" included. `python -m bench.chaos --network` runs every kind, seeded.
"""

from __future__ import annotations

import json

import pytest

from tests.chaos.executor import ChaosRun
from tests.chaos.invariants import check
from tests.chaos.net_kinds import NetSettings
from tests.chaos.network import Network
from tests.chaos.schedule import Fault

SETTINGS = NetSettings(first_fault_step=2, gap_steps=2, tail_steps=2)


def _run(tmp_path, schedule: tuple[Fault, ...]):
    with Network() as net:
        for name in ("etcd", "ca", "cb", *(f"h{i}" for i in range(SETTINGS.replicas))):
            net.add(name)
        recorded = ChaosRun(tmp_path, SETTINGS, schedule, seed=3, net=net).run()
        records = [r.to_json() for r in net.faults.records]
    verdict = check(recorded, SETTINGS)
    summary = json.dumps({**verdict.stats, "injections": recorded.to_json()["injections"], "faults": records},
                         indent=1)
    assert verdict.violations == [], f"{verdict.violations}\n{summary}\nlogs in {tmp_path}"
    assert [i.scheduled for i in recorded.injections] == [f.describe() for f in schedule], summary
    assert all(i.settled_at is not None for i in recorded.injections), summary
    assert all(r["ended_at"] is not None for r in records), summary  # every fault healed
    return recorded, verdict, records


@pytest.mark.etcd
@pytest.mark.timeout(SETTINGS.run_timeout_s + 60)
def test_a_partitioned_host_and_a_leader_cut_from_etcd_keep_every_invariant(tmp_path):
    schedule = (Fault("partition_host", ("r1",), stop_s=5.0), Fault("cut_leader_from_etcd", stop_s=5.0))
    recorded, verdict, records = _run(tmp_path, schedule)
    partition, cut = recorded.injections
    assert partition.hosts == ["h1"] and partition.replicas == ["r1"]
    assert [r["kind"] for r in records] == ["partition", "cut"]
    # the cut controller stepped down and the other one took over: two terms at least after it
    assert verdict.stats["leader_terms"] >= 2
    stepped = [e for e in recorded.leadership[cut.controller] if "stepped down" in e["message"]]
    assert any(cut.at <= e["at"] <= cut.done_at for e in stepped), recorded.leadership
