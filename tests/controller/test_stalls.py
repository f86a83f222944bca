"""Stalls from the committed-step timeline (controller.core.stalls), by tables, and from the
goodput tracker's own samples on a fake clock: the survivors' stall after a failure, not only
the failed replica's time to recover."""

import pytest

from controller.core.goodput import GoodputTracker
from controller.core.stalls import Pause, find_stalls, pauses, typical_step_s


def steady(t0, t1, step0, every_s=1.0, healthy=2):
    """Samples of a job committing one step every `every_s` from t0 to t1 (inclusive)."""
    n = round((t1 - t0) / every_s)
    return [(t0 + i * every_s, step0 + i, healthy) for i in range(n + 1)]


@pytest.mark.parametrize("name, samples, until, running, expected", [
    ("no samples", [], 5.0, True, []),
    ("startup before the first commit is no pause", [(0.0, -1, 0), (4.0, 0, 2)], 4.0, True, []),
    ("steady steps, the last one ongoing", steady(0, 2, 0), 2.5, True,
     [Pause(0, 1, 0, False), Pause(1, 2, 1, False), Pause(2, 2.5, 2, True)]),
    ("a job that ended: its last pause is not ongoing", steady(0, 1, 0), 3.0, False,
     [Pause(0, 1, 0, False), Pause(1, 3.0, 1, False)]),
    ("a healthy-count sample inside a pause does not split it", [(0, 0, 2), (1, 1, 2), (3, 1, 1), (9, 2, 1)], 9.0, True,
     [Pause(0, 1, 0, False), Pause(1, 9, 1, False)]),
])
def test_pauses(name, samples, until, running, expected):
    assert pauses(samples, until, running) == expected, name


@pytest.mark.parametrize("name, samples, expected", [
    ("nothing committed", [(0.0, -1, 0)], None),
    ("one step a second", steady(0, 10, 0), 1.0),
    ("samples a second apart holding 20 steps each", [(i, 20 * i, 2) for i in range(6)], 0.05),
    ("a stall does not move the median", steady(0, 10, 0) + [(40.0, 11, 2)], 1.0),
])
def test_typical_step(name, samples, expected):
    got = typical_step_s(samples)
    assert got == (pytest.approx(expected) if expected is not None else None), name


def failure(replica, died_at, detect_s, recover_s=None):
    return {"replica": replica, "cause": "heartbeat", "died_at": died_at, "detect_s": detect_s,
            "recovered_at": None if recover_s is None else died_at + recover_s, "recover_s": recover_s}


# A job at one step a second stands still from t=10 to t=20; r2 was last heard from at 10.5 and
# declared dead by silence at 13.5.
STALLED = steady(0, 10, 0) + steady(20, 25, 11)


@pytest.mark.parametrize("name, samples, failures, quorums, until, running, min_stall_s, stalls, given", [
    ("steady: no stall", steady(0, 30, 0), [], [], 30.0, True, 1.0, [], []),
    ("the stall and the failure in it", STALLED, [failure("r2", 13.5, 3.0, 0.09)],
     [(5.0, 1001, "first"), (19.5, 1002, "r2 is dead")], 25.0, True, 1.0,
     [(10.0, 20.0, 10, ("r2",), 1002, "r2 is dead")], [("r2", 10.0)]),
    ("a failure declared after the job went on is still given the stall its window overlaps",
     STALLED, [failure("r1", 21.5, 11.5)], [], 25.0, True, 1.0,
     [(10.0, 20.0, 10, ("r1",), 0, "")], [("r1", 10.0)]),
    ("a failure outside the timeline gets no pause", STALLED, [failure("r0", -50.0, 1.0)], [], 25.0, True, 1.0,
     [(10.0, 20.0, 10, (), 0, "")], [("r0", None)]),
    ("a failure while the job trained at its pace is given that short pause", steady(0, 10, 0),
     [failure("r1", 4.5, 0.2)], [], 10.0, True, 1.0, [], [("r1", 1.0)]),
    ("ongoing while the job runs", steady(0, 5, 0), [], [], 9.0, True, 1.0, [(5.0, 9.0, 5, (), 0, "")], []),
    ("a slow job's step is no stall: the threshold is STALL_FACTOR typical steps",
     steady(0, 100, 0, every_s=20.0) + [(130.0, 6, 2), (200.0, 7, 2)], [], [], 200.0, False, 1.0,
     [(130.0, 200.0, 6, (), 0, "")], []),
    ("min_stall_s bounds it from below", steady(0, 2, 0, every_s=0.1) + [(2.5, 21, 2)], [], [], 2.5, False, 1.0, [], []),
])
def test_find_stalls(name, samples, failures, quorums, until, running, min_stall_s, stalls, given):
    report = find_stalls(samples, failures, quorums, until, running, min_stall_s)
    got = [(s.pause.start, s.pause.end, s.pause.step, tuple(r for r, _ in s.failures), s.quorum_id, s.quorum_reason)
           for s in report.stalls]
    assert got == stalls, name
    assert [(g.failure["replica"], g.pause.seconds if g.pause else None) for g in report.failures] == given, name


def test_the_survivors_stall_from_the_trackers_own_timeline():
    """Three replicas commit every 0.1 s; r2's host goes silent after the commit at t=5.3; it is
    declared dead at 8.3 and its spare is HEALTHY 0.09 s later, but the round waits until 15.0
    and the job commits again at 15.1: the job stood still 9.8 s while r2's time to recover
    says 0.09 s."""
    g = GoodputTracker(3)
    t, step = 0.0, 0
    for rid in ("r0", "r1", "r2"):
        g.on_join(rid, 0.0)
        g.on_state(rid, True, False, "", 0.0, 0.0)
    g.on_quorum(["r0", "r1", "r2"], 0.0)
    while t < 5.3 - 1e-9:
        t = round(t + 0.1, 3)
        for rid in ("r0", "r1", "r2"):
            g.on_commit(rid, step, 0.1, True, t)
        step += 1
    # seen while it stands still: the last advance (5.3) is in no chart sample (one a second)
    assert max(s[0] for s in g.history) == 5.0
    (ongoing,) = find_stalls(g.timeline(), [], [], 7.0, True).stalls
    assert ongoing.pause == Pause(5.3, 7.0, step - 1, True)
    g.on_state("r2", False, True, "heartbeat", 5.3, 8.3)
    g.on_state("r2", True, False, "", 8.3, 8.39)
    g.on_quorum(["r0", "r1", "r2"], 15.0)
    for i in range(5):
        for rid in ("r0", "r1", "r2"):
            g.on_commit(rid, step, 0.1, True, round(15.1 + 0.1 * i, 3))
        step += 1
    view = g.view(15.5)
    (f,) = view.recent_failures
    assert f["recover_s"] == pytest.approx(0.09) and f["detect_s"] == pytest.approx(3.0)
    report = find_stalls(g.timeline(), view.recent_failures, [(15.0, 7, "r2 is back")], 15.5, True)
    assert report.typical_step_s == pytest.approx(0.1, rel=0.05)
    (stall,) = report.stalls
    # both edges exact although samples are at most one a second: the last advance before the pause is kept
    assert (stall.pause.start, stall.pause.end) == (5.3, 15.1)
    assert stall.failures == (("r2", 8.3),) and stall.quorum_id == 7
    (given,) = report.failures
    assert given.pause == stall.pause and given.pause.seconds == pytest.approx(9.8)
