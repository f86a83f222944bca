"""Random jobs with one injected hang (and noise), checked against a naive reference that walks
the wait-for chain rank by rank; random windows checked against a naive median/MAD."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from controller.core.diagnosis.hang import find_hangs
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.straggler import judge_window
from controller.core.diagnosis.telemetry import GroupKey, group_key

from .synth import Job

S = DiagnosisSettings(hang_after_s=30.0)
NOW = 1000.0


def naive_culprit(views, now, hang_s):
    """Start at the rank stuck longest, follow 'waits for' until a rank stuck nowhere (it never
    joined) or a collective everyone joined (the member that sent least)."""
    def stuck_in(rk):
        v = views[rk]
        old = [(v.received_at - g.pending_s, group_key(rk[0], rk[1], g), g.pending_seq)
               for g in v.report.groups if g.pending_seq >= 0 and now - (v.received_at - g.pending_s) >= hang_s]
        return min(old, key=lambda x: x[0]) if old else None

    stuck = {rk: stuck_in(rk) for rk in views}
    start = min((rk for rk in views if stuck[rk]), key=lambda rk: stuck[rk][0], default=None)
    seen, rk = set(), start
    while rk is not None and rk not in seen:
        seen.add(rk)
        _, key, seq = stuck[rk]
        members = [(m, g) for m, v in views.items() for g in v.report.groups if group_key(m[0], m[1], g) == key]
        behind = [m for m, g in members if g.last_joined_seq < seq]
        if not behind:
            flying = [(g.pending_sent_bytes, -g.pending_idle_s, m) for m, g in members if g.last_done_seq < seq]
            return min(flying)[2]
        free = [m for m in behind if not stuck[m]]
        if free:
            return max(free, key=lambda m: views[m].report.idle_s)
        rk = behind[0]
    return None


@pytest.mark.parametrize("seed", range(40))
def test_hang_culprit_matches_the_naive_walk(seed):
    rng = random.Random(seed)
    job = Job(replicas=rng.randint(2, 5), ranks=rng.randint(2, 6), per_host=rng.choice((1, 2, 3)))
    culprit = (rng.choice(job.replicas), rng.randrange(job.ranks))
    waited = rng.uniform(31, 120)
    kind = rng.choice(("never_joins", "no_progress_cross", "no_progress_intra"))
    if kind == "never_joins":
        job.never_joins(culprit, waited)
    else:
        job.no_progress(culprit, waited, cross=kind == "no_progress_cross")
    for rk, v in list(job.views.items()):  # noise: reports arrive at different times, ages follow
        if rk != culprit and rng.random() < 0.5:
            shift = rng.uniform(0, 3)
            job.views[rk] = replace(v, received_at=v.received_at - shift, report=v.report._replace(groups=tuple(
                g._replace(pending_s=max(g.pending_s - shift, 0)) if g.pending_seq >= 0 else g
                for g in v.report.groups)))
    found = find_hangs(job.views, NOW, S)
    assert found, f"{kind} at {culprit} was not found"
    expected = naive_culprit(job.views, NOW, S.hang_after_s)
    assert expected == culprit
    assert found[0].ranks[0] == f"{culprit[0]}/{culprit[1]}" and found[0].hosts[0] == job.host(culprit)


def naive_flags(values, k, excess, excess_s):
    xs = sorted(values.values())
    n = len(xs)
    med = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    dev = sorted(abs(x - med) for x in xs)
    mad = (dev[(n - 1) // 2] + dev[n // 2]) / 2
    return sorted(rk for rk, v in values.items() if v > med + max(k * 1.4826 * mad, excess * med, excess_s))


@pytest.mark.parametrize("seed", range(40))
def test_window_flags_match_the_naive_median_and_mad(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 40)
    base = (0.0004, 0.004, 1.0)[seed % 3]  # sub-ms own times (FTAR) meet the absolute floor
    values = {("r", i): base * rng.lognormvariate(0, 0.05) * (rng.choice((1, 1, 1, 1.3, 3, 9))
                                                             if rng.random() < 0.2 else 1)
              for i in range(n)}
    v = judge_window(GroupKey("g", "r", -1), 0, values, {}, S)
    assert [f.rank for f in v.flags] == naive_flags(values, S.straggler_mad_k, S.straggler_min_excess,
                                                    S.straggler_min_excess_s)
