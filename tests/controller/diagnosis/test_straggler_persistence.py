"""Straggler persistence in time as well as in windows, on a fake clock: scattered noise at fast
steps names nobody, a real straggler is found once the span passed, slow steps keep the window
count rule, and the memory kept per group is bounded."""

from __future__ import annotations

import math
import random
import re

import pytest

from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.straggler import (MAX_JUDGED_PER_GROUP, StragglerTracker, StragglerWindows,
                                                 judge_window)
from controller.core.diagnosis.telemetry import GroupKey

S = DiagnosisSettings(straggler_windows=3, straggler_of_windows=5, straggler_min_span_s=5.0)
OLD_RULE = DiagnosisSettings(straggler_windows=3, straggler_of_windows=5, straggler_min_span_s=0.0)
KEY = GroupKey("replica", "pooled", -1)
#: the chaos run's job: 3 replicas of 2 ranks, their intra-replica windows pooled
MEMBERS = [(r, k) for r in ("r0", "r1", "r2") for k in (0, 1)]
STEP_S = 0.1


def replay(settings, windows_n, report_s, seed, noise=0.15, slow=None, slow_from=0, factor=1.5):
    """`windows_n` one-step windows at 0.1 s steps, reported every `report_s` (windows are judged
    when their report comes). In a fraction `noise` of the windows one of the rank 1s (the noise
    seen in the chaos run was mostly on them) is 1.1-1.85x slow; `slow` is `factor` slow from
    window `slow_from` on. Returns the findings."""
    rng = random.Random(seed)
    windows, tracker, found = StragglerWindows(settings), StragglerTracker(settings), []
    for i in range(windows_n):
        noisy = rng.choice([m for m in MEMBERS if m[1] == 1]) if rng.random() < noise else None
        jitter = rng.uniform(1.1, 1.85)
        now = math.ceil(round((i + 1) * STEP_S / report_s, 6)) * report_s
        for n, rk in enumerate(MEMBERS):
            own = 0.1 * (1 + 0.01 * ((n + i) % 3))
            own *= jitter if rk == noisy else 1.0
            own *= factor if rk == slow and i >= slow_from else 1.0
            for v in windows.add(KEY, i, len(MEMBERS), rk, "h", own, now):
                found += tracker.observe(v, now)
    return found


@pytest.mark.parametrize("report_s, seed", [(0.1, 1), (1.0, 2), (5.0, 3)])
def test_scattered_noise_at_fast_steps_names_nobody(report_s, seed):
    # 200 s of 0.1 s steps, 15 % of the windows flagging a random rank 1 (the chaos run: 28 in 215)
    assert replay(S, 2000, report_s, seed) == []
    # the window count alone (3 of 5 windows: half a second) names healthy ranks in the same run
    assert replay(OLD_RULE, 2000, report_s, seed) != []


@pytest.mark.parametrize("report_s", [0.1, 1.0])
def test_a_real_straggler_at_fast_steps_is_found_once_the_span_passed(report_s):
    # r1/1 1.5x slow from t=10 s, in the same noise: 31 flags in the span's 51 windows take 3 s
    [f] = replay(S, 300, report_s, seed=4, slow=("r1", 1), slow_from=100)
    assert f.ranks == ("r1/1",) and 10.0 + 3.0 <= f.at <= 10.0 + S.straggler_min_span_s + report_s
    assert re.search(r"was 1\.[45]\dx the median .* in (3[1-9]|4\d|5[01]) of its last 51 windows", f.evidence[0])
    # slow from the first window (judged at report_s): not before the group was judged for the span
    [first] = replay(S, 300, report_s, seed=4, slow=("r1", 1))
    assert first.ranks == ("r1/1",) and first.at == pytest.approx(report_s + S.straggler_min_span_s)
    assert replay(S, 300, report_s, seed=4, slow=("r1", 1), slow_from=100, factor=1.0) == []


def test_windows_nobody_was_judged_in_do_not_dilute_the_evidence():
    # every other window all but 2 members were disturbed (a quorum change, checkpoints): not judged
    tracker, found = StragglerTracker(S), []
    own = {("r1", k): 0.1 * (1.5 if k == 5 else 1 + 0.001 * k) for k in range(8)}
    for i in range(100):
        disturbed = frozenset(("r1", k) for k in range(2, 8)) if i % 2 else frozenset()
        found += tracker.observe(judge_window(KEY, i, own, {}, S, disturbed), STEP_S * i)
    [f] = found
    assert f.ranks == ("r1/5",) and f.at == pytest.approx(S.straggler_min_span_s)


def old_rule(flagged: list[set[int]], of: int = 5, need: int = 3) -> list[tuple[int, int]]:
    """The rule as it was, naively: (window, rank) when a rank not in an episode has `need`
    flags in the last `of` windows; its episode ends with `of` windows without a flag."""
    out, reported = [], set()
    for i in range(len(flagged)):
        for rank in sorted(set().union(*flagged[max(i - of + 1, 0):i + 1]) | reported):
            recent = sum(rank in flagged[j] for j in range(max(i - of + 1, 0), i + 1))
            if recent == 0:
                reported.discard(rank)
            elif recent >= need and rank not in reported:
                reported.add(rank)
                out.append((i, rank))
    return out


@pytest.mark.parametrize("step_s, seed", [(1.25, 5), (2.0, 6), (2.0, 7), (10.0, 8)])
def test_at_slow_steps_the_window_count_rule_is_unchanged(step_s, seed):
    rng = random.Random(seed)
    warm = math.ceil(S.straggler_min_span_s / step_s)  # the group's first span: judged, no finding
    flagged = [set() for _ in range(warm)] + [{k for k in (3, 7, 11) if rng.random() < 0.4} for _ in range(200)]
    tracker, found = StragglerTracker(S), []
    for i, slow in enumerate(flagged):
        own = {("r1", k): 2.0 * (1 + 0.01 * ((k * 7919) % 11 - 5) / 5) * (1.5 if k in slow else 1.0)
               for k in range(16)}
        found += [(i, int(f.ranks[0].split("/")[1])) for f in
                  tracker.observe(judge_window(KEY, i, own, {}, S), step_s * i)]
    expected = old_rule(flagged)
    assert sorted(found) == expected and len(expected) >= 5


def test_the_memory_kept_per_group_is_bounded():
    tracker = StragglerTracker(S)
    own = {("r1", k): 0.01 * (1.5 if k == 5 else 1 + 0.001 * k) for k in range(8)}
    for i in range(3 * MAX_JUDGED_PER_GROUP):  # 0.002 s steps: 2,500 windows in the span
        tracker.observe(judge_window(KEY, i, own, {}, S), 0.002 * i)
    assert tracker.kept() == (MAX_JUDGED_PER_GROUP, MAX_JUDGED_PER_GROUP)
    for i in range(3 * MAX_JUDGED_PER_GROUP, 3 * MAX_JUDGED_PER_GROUP + 20):  # then 2 s steps
        tracker.observe(judge_window(KEY, i, own, {}, S), 0.002 * 3 * MAX_JUDGED_PER_GROUP + 2.0 * (i + 1))
    assert tracker.kept() == (S.straggler_of_windows, S.straggler_of_windows)
