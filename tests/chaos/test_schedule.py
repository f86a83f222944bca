"""The chaos schedule: pure, seeded, within its bounds; settings and seed ranges refuse bad values."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

import random

from tests.chaos.schedule import (
    CONTROLLER_KINDS, HOST_KINDS, KINDS, ChaosSettings, make_schedule, parse_seeds, stop_past_the_timeouts,
)

S = ChaosSettings()


def test_a_seed_gives_one_schedule_and_seeds_differ():
    assert make_schedule(7, S) == make_schedule(7, S)
    assert len({make_schedule(seed, S) for seed in range(20)}) == 20


def test_a_schedule_as_long_as_the_kinds_has_one_fault_of_each_kind():
    for seed in range(50):
        faults = make_schedule(seed, replace(S, faults=len(KINDS), spares=len(HOST_KINDS)))
        assert sorted(f.kind for f in faults) == sorted(KINDS), seed


@pytest.mark.parametrize("seed", range(30))
def test_targets_ranks_and_durations_are_within_bounds(seed):
    ids = set(S.replica_ids)
    faults = make_schedule(seed, replace(S, faults=12))
    assert sum(f.kind in HOST_KINDS for f in faults) <= S.spares  # each host kill uses up a spare
    for f in faults:
        assert set(f.replicas) <= ids and len(set(f.replicas)) == len(f.replicas)
        assert len(f.replicas) == {"double_kill": 2, "kill_controller": 0}.get(f.kind, 1), f
        if f.kind == "kill_rank":
            assert 1 <= f.rank < S.ranks  # never the leader: that is kill_leader
        assert 0 <= f.rank < S.ranks
        if f.kind == "stop_replica":
            assert f.stop_s > S.heartbeat_timeout_s  # past the timeout, or nobody would notice
        if f.kind in CONTROLLER_KINDS:
            assert S.controller_down_s[0] <= f.down_s <= S.controller_down_s[1]
        else:
            assert f.down_s == 0


def test_without_spares_no_host_is_killed():
    kinds = Counter(f.kind for seed in range(20) for f in make_schedule(seed, replace(S, spares=0, faults=7)))
    drawn = []
    for seed in range(20):  # the kinds each seed's permutation puts first, before any is replaced
        order = list(KINDS)
        random.Random(seed).shuffle(order)
        drawn += order[:7]
    assert not any(kinds[k] for k in HOST_KINDS)
    # the host kills became leader kills
    assert kinds["kill_leader"] == sum(k == "kill_leader" or k in HOST_KINDS for k in drawn) > 40


@pytest.mark.parametrize("change, message", [
    ({"replicas": 2}, "replicas must be at least 3 (a double kill leaves one), got 2."),
    ({"ranks": 1}, "ranks must be at least 2 (kill_rank kills a rank other than 0), got 1."),
    ({"faults": -1}, "faults must not be negative, got -1."),
    ({"gap_steps": 0}, "gap_steps must be at least 1, got 0."),
    ({"stop_past_timeout_s": (2.0, 1.0)}, "stop_past_timeout_s must be a range (low, high) with 0 <= low <= high"),
    ({"stop_past_timeout_s": (0.0, 1.0)}, "stop_past_timeout_s must start above 0"),
])
def test_bad_settings_are_refused_naming_the_value(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replace(S, **change).validate()


def test_seed_ranges():
    assert parse_seeds("1-3,7, 9-9") == [1, 2, 3, 7, 9]
    for bad in ("1-", "x", "5-2", "-3"):
        with pytest.raises(ValueError, match=repr(bad.strip()).replace("-", r"\-")):
            parse_seeds(bad)
    with pytest.raises(ValueError, match="10001 seeds is too many"):
        parse_seeds("0-10000")


def test_a_stop_right_after_a_takeover_outlasts_its_grace():
    # 1.5 s past a 3 s heartbeat timeout; a takeover at t=100 forgives silence until 100 + 7 + 3
    assert stop_past_the_timeouts(4.5, 101.0, None, 7.0, 3.0) == 4.5
    assert stop_past_the_timeouts(4.5, 101.0, 100.0, 7.0, 3.0) == 10.5  # dead at 110 at the earliest, back at 111.5
    assert stop_past_the_timeouts(4.5, 120.0, 100.0, 7.0, 3.0) == 4.5   # the grace is long over
