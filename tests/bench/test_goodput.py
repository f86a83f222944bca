"""The goodput model: closed forms, the paper's numbers, spare-pool effects, bad parameters."""

import dataclasses
import json
import random

import pytest

from bench import goodput as g

HORIZON_S = 3000 * 3600.0  # ~10,000 failures at the paper's rate


def _ft(params, seed=1, horizon_s=HORIZON_S):
    failures = g.sample_failures(random.Random(seed), params.mtbf_s, horizon_s, params.replicas)
    return g.simulate_ft(failures, params, horizon_s)


def _sync(params, seed=1, horizon_s=HORIZON_S):
    failures = g.sample_failures(random.Random(seed), params.mtbf_s, horizon_s)
    return g.simulate_sync(failures, params, horizon_s)


@pytest.mark.parametrize("mtbf_s,restart_s", [(1080, 600), (3600, 600), (1080, 60), (600, 300)])
def test_sync_simulation_matches_closed_form(mtbf_s, restart_s):
    params = g.SyncParams(mtbf_s=mtbf_s, restart_s=restart_s)
    assert _sync(params).effective_training == pytest.approx(g.closed_form_sync(params), abs=0.01)


@pytest.mark.parametrize("params", [g.PAPER_FT, g.PAPER_FT_FIXED,
                                    dataclasses.replace(g.PAPER_FT, replicas=4, restart_s=30.0)])
def test_ft_simulation_is_near_closed_form(params):
    # The closed form ignores overlapping failures, which only make the simulation slightly better.
    sim, closed = _ft(params).effective_training, g.closed_form_ft(params)
    assert closed - 0.005 <= sim <= closed + 0.03


def test_paper_presets_reproduce_44_and_80_percent():
    assert 100 * g.closed_form_sync(g.SyncParams()) == pytest.approx(44.4, abs=0.1)
    assert 100 * g.closed_form_ft(g.PAPER_FT) == pytest.approx(80.1, abs=0.1)
    assert 100 * _sync(g.SyncParams(), seed=7).effective_training == pytest.approx(44, abs=2)
    assert 100 * _ft(g.PAPER_FT, seed=7).effective_training == pytest.approx(80, abs=3)


def test_same_seed_same_answer_and_no_failures_means_full_training():
    assert _ft(g.PAPER_FT, seed=3) == _ft(g.PAPER_FT, seed=3)
    assert g.simulate_ft([], g.PAPER_FT, 3600.0).effective_training == 1.0
    assert g.simulate_sync([], g.SyncParams(), 3600.0).effective_training == 1.0


def test_single_failure_accounting_by_hand():
    params = dataclasses.replace(g.PAPER_FT, replicas=4, detection_s=10, rebuild_s=20, swap_s=100,
                                 catchup_s=5, first_step_s=15, rejoin_stall_s=7)
    host = g.Cause("host", 1, True)
    result = g.simulate_ft([g.Failure(100.0, host, 2)], params, 1000.0)
    # 30 s stall for all 4 replicas, replica 2 out 120 s more, 7 s rejoin stall for all.
    lost = 4 * 30 + 120 + 4 * 7
    assert result.effective_training == pytest.approx(1 - lost / 4000)
    sync = g.simulate_sync([g.Failure(100.0, host, 0), g.Failure(150.0, host, 0)],
                           g.SyncParams(restart_s=100), 1000.0)
    assert sync.effective_training == pytest.approx(0.8)  # second restart queues behind the first


def test_empty_spare_pool_costs_goodput_and_a_pool_sized_by_littles_law_does_not():
    base = dataclasses.replace(g.PAPER_FT_FIXED, host_repair_s=6 * 3600.0)
    in_use = g.host_share() * base.host_repair_s / base.mtbf_s  # mean spares out for repair
    unlimited = _ft(base).effective_training
    none = _ft(dataclasses.replace(base, spares=0)).effective_training
    sized = _ft(dataclasses.replace(base, spares=int(in_use + 4 * in_use ** 0.5) + 1)).effective_training
    assert none < unlimited - 0.2
    assert sized == pytest.approx(unlimited, abs=0.002)


def test_process_failures_skip_the_swap():
    params = dataclasses.replace(g.PAPER_FT_FIXED, restart_s=30.0)
    assert g.closed_form_ft(params) > g.closed_form_ft(g.PAPER_FT_FIXED)
    assert 0.15 < 1 - g.host_share() < 0.17  # watchdog timeouts + software bugs in Table 1


@pytest.mark.parametrize("field,value", [
    ("mtbf_s", 0), ("mtbf_s", -5.0), ("detection_s", -1.0), ("swap_s", float("nan")),
    ("replicas", 0), ("spares", -1), ("catchup_s", "3"),
])
def test_bad_ft_parameters_raise_naming_the_value(field, value):
    params = dataclasses.replace(g.PAPER_FT, **{field: value})
    with pytest.raises(ValueError, match=field) as err:
        params.validate()
    assert repr(value) in str(err.value)
    with pytest.raises(ValueError, match=field):
        g.simulate_ft([], params, 3600.0)


@pytest.mark.parametrize("kwargs,field", [({"mtbf_s": 0}, "mtbf_s"), ({"restart_s": -600}, "restart_s")])
def test_bad_sync_parameters_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        g.closed_form_sync(g.SyncParams(**kwargs))


def test_bad_sampling_arguments_raise():
    with pytest.raises(ValueError, match="mtbf_s must be positive, got 0"):
        g.sample_failures(random.Random(0), 0, 3600.0)
    with pytest.raises(ValueError, match="horizon_s"):
        g.sample_failures(random.Random(0), 1080.0, -1.0)


def test_cli_prints_one_json_line_per_scenario(capsys):
    assert g.main(["--json", "--horizon-h", "500"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["scenario"] for r in rows] == [name for name, _ in g.scenarios()]
    for row in rows:
        assert {"scenario", "effective_training_pct", "failures", "horizon_h", "parameters"} <= set(row)
        assert row["horizon_h"] == 500
