"""The network chaos schedule and figures (tests/chaos/net_kinds.py), pure; and bench.chaos
--network refusing bad flags by name."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from protos.credentials import REGISTRATION_WINDOW_S
from tests.chaos.executor import Injection, Recorded
from tests.chaos.net_kinds import KINDS, NetSettings, figures, make_net_schedule

SETTINGS = NetSettings()


def test_a_schedule_of_as_many_faults_as_kinds_has_one_of_each_and_the_same_seed_the_same_schedule():
    for seed in range(41, 61):
        schedule = make_net_schedule(seed, SETTINGS)
        assert Counter(f.kind for f in schedule) == Counter(KINDS)
        assert schedule == make_net_schedule(seed, SETTINGS)
        for f in schedule:
            assert SETTINGS.fault_s[0] <= f.stop_s <= SETTINGS.fault_s[1]
            assert (1 <= f.percent <= 5) == (f.kind == "lossy_host")
            assert (f.rate_kbit > 0) == (f.kind == "capped_host")
            assert (50 <= f.delay_ms <= 150) == (f.kind == "slow_host")
            assert (f.replicas == ()) == (f.kind in ("cut_leader_from_etcd", "skewed_host"))
            assert (f.skew_s != 0) == (f.kind == "skewed_host")
    assert len({make_net_schedule(s, SETTINGS) for s in range(41, 61)}) > 10


def test_the_benchmark_seeds_skew_clocks_beyond_and_within_the_window_on_both_sides():
    skews = [f.skew_s for seed in range(41, 61) for f in make_net_schedule(seed, SETTINGS) if f.skew_s]
    assert len(skews) == 20
    beyond = [s for s in skews if abs(s) > REGISTRATION_WINDOW_S]
    within = [s for s in skews if abs(s) < REGISTRATION_WINDOW_S]
    assert len(beyond) >= 5 and len(within) >= 5, skews
    assert min(beyond) < 0 < max(beyond) and min(within) < 0 < max(within), skews
    assert all(abs(s) <= SETTINGS.skew_beyond_s[1] and abs(s) >= SETTINGS.skew_within_s[0] for s in skews), skews


@pytest.mark.parametrize("bad, named", [
    ({"replicas": 1}, "replicas must be at least 2"),
    ({"fault_s": (2.0, 5.0)}, "(2.0, 5.0)"),
    ({"loss_percent": (0, 5)}, "(0, 5)"),
    ({"rate_kbit": (4, 100)}, "(4, 100)"),
    ({"delay_ms": (0, 100)}, "(0, 100)"),
    ({"skew_beyond_s": (250.0, 400.0)}, "skew_beyond_s must be a range beyond the 300s registration window, got "
                                        "(250.0, 400.0)"),
    ({"skew_within_s": (30.0, 300.0)}, "(30.0, 300.0)"),
    ({"join_timeout_s": 0}, "join_timeout_s must be above 0 seconds, got 0"),
])
def test_bad_settings_are_refused_by_name(bad, named):
    with pytest.raises(ValueError) as err:
        NetSettings(**bad).validate()
    assert named in str(err.value)


def test_figures_say_how_long_the_replica_was_out_and_how_long_the_others_stalled():
    inj = Injection("partition_host", "partition_host:r1 for 5.0s", at=100.0, step=5, replicas=["r1"],
                    hosts=["h1"], done_at=105.0, settled_at=107.0)
    rows = [{"event": "commit", "rank": 0, "replica": "r0", "t": t, "step": step}
            for t, step in ((99.0, 4), (101.0, 5), (104.0, 6), (106.5, 7))]
    rows += [{"event": "commit", "rank": 0, "replica": "r1", "t": 99.0, "step": 4},
             {"event": "commit", "rank": 0, "replica": "r1", "t": 106.8, "step": 7}]
    events = [{"kind": "death", "subject": "r1", "at": 103.0, "message": "r1 died"},
              {"kind": "replica", "subject": "r1", "at": 106.0, "message": "replica r1 became HEALTHY in quorum 9"}]
    rec = Recorded(1, rows, events, [inj], [], True, 90.0, 120.0)
    (row,) = figures(rec, SETTINGS)
    assert row == {"kind": "partition_host", "scheduled": "partition_host:r1 for 5.0s", "lasted_s": 5.0,
                   "exclude_s": 3.0, "back_s": 1.0, "steps_missed": 2, "survivors_stall_s": 3.0}


@pytest.mark.parametrize("flags, named", [(["--fault-s", "1", "2"], "(1.0, 2.0)"), (["--faults", "-1"], "-1")])
def test_bench_chaos_network_refuses_bad_flags_by_name(flags, named):
    done = subprocess.run([sys.executable, "-m", "bench.chaos", "--network", "--seeds", "1", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and named in done.stderr, done.stderr
