"""Seeded chaos over real processes: 3 replicas x 2 ranks, a warm spare, two controllers on a
real etcd, agents supervising the demo's trainers; each seed's faults carried out for real,
then every invariant checked over what was recorded (tests/chaos/invariants.py).

One fixed seed runs here, as a user runs it: `python -m bench.chaos --seeds 17 --json` (its line
checked against the benchmark's declared fields too, so this is bench.chaos's smoke run as
well: tests/bench/smoke.py). The suite's time is bounded (a minute or two on 2 idle cores); the seed is chosen
for the faults that need the most machinery: a host swapped for the warm spare and then the
active controller killed (a composed fault: the spare must keep its new work through the
takeover), a SIGSTOP past the timeouts, a recovering replica losing its source. Its kill_source
starts with a leader kill, and the runtime tests kill ranks and replicas on their own
(tests/runtime/); `python -m bench.chaos --seeds 1-20 --json` carries out every kind, as many
seeds as you like.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.bench import smoke
from tests.chaos.schedule import KINDS, ChaosSettings, make_schedule

COMPOSED = ("swap_then_kill_controller", "kill_controller_catching_up", "kill_host_in_grace")

SETTINGS = ChaosSettings()
SEEDS = (17,)
assert smoke.SMOKE["chaos"].args == ("--seeds", ",".join(map(str, SEEDS)))
BENCH_SEEDS = range(1, 21)


def test_the_fixed_seed_carries_out_the_faults_that_need_the_most_machinery():
    kinds = {f.kind for seed in SEEDS for f in make_schedule(seed, SETTINGS)}
    assert kinds == {"swap_then_kill_controller", "stop_replica", "kill_leader", "kill_source"}, kinds


def test_the_benchmark_seeds_carry_out_every_kind_of_fault_several_times():
    kinds = Counter(f.kind for seed in BENCH_SEEDS for f in make_schedule(seed, SETTINGS))
    assert set(kinds) == set(KINDS), kinds
    # the composed kinds share the one spare with kill_host: fewer of them in 20 seeds
    assert min(n for k, n in kinds.items() if k not in COMPOSED) >= 5, kinds
    assert min(kinds[k] for k in COMPOSED) >= 3, kinds


@pytest.mark.slow
@pytest.mark.etcd
@pytest.mark.timeout(SETTINGS.run_timeout_s * len(SEEDS) + 60)
def test_seeded_faults_keep_every_invariant(tmp_path):
    *lines, summary = smoke.check("chaos", "--keep", str(tmp_path), ok_status=(0, 1))  # 1: a violation
    assert [line["seed"] for line in lines] == list(SEEDS)
    for line in lines:
        seed, schedule = line["seed"], make_schedule(line["seed"], SETTINGS)
        shown = json.dumps({k: line[k] for k in ("injections", "timeline", "trainer_errors")}, indent=1)
        assert line["violations"] == [], f"seed {seed}: {line['violations']}\n{shown}\nlogs in {tmp_path}"
        assert line["schedule"] == [f.describe() for f in schedule]
        assert [i["kind"] for i in line["injections"]] == [f.kind for f in schedule]  # every fault landed
        assert all(i["settle_s"] is not None for i in line["injections"]), shown
        assert line["steps"] > SETTINGS.first_fault_step + len(schedule) * SETTINGS.gap_steps
    assert summary["violations"] == 0 and summary["faults"] == len(SEEDS) * SETTINGS.faults
