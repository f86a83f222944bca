"""Table tests of the pure quorum policy: each rule, each reason."""

import math

import pytest

from controller.core.quorum import RoundView, assign_recovery, compute_quorum, form_quorum, lr_scale

A, B, C, D = "a", "b", "c", "d"


def view(joined, live, previous=(), first=0.0, unregistered=0):
    return RoundView(joined={r: 5 for r in joined}, first_join_at=first if joined else None,
                     live=frozenset(live), previous=frozenset(previous), unregistered=unregistered)


@pytest.mark.parametrize(
    "name, v, now, members, reason",
    [
        ("nobody", view([], [A, B]), 0, None, "no replica has joined"),
        ("fast path", view([A, B], [A, B], previous=[A, B]), 0, {A, B}, "fast path"),
        ("below minimum, even after timeout", view([A], [A, B, C]), 99, None, "min_replicas is 2"),
        ("all live joined", view([A, B, C], [A, B, C], previous=[A, B]), 0, {A, B, C}, "all 3 live"),
        ("minority never closes", view([A, B], [A, B, C, D]), 99, None, "not a majority of 4"),
        ("waits for missing", view([A, B], [A, B, C]), 1.0, None, "waiting up to 1s more for c"),
        ("join timeout", view([A, B], [A, B, C]), 2.0, {A, B}, "join timeout after 2s"),
        ("timeout counts from first joiner", view([A, B], [A, B, C], first=10.0), 11.5, None, "waiting"),
        ("unregistered replicas are awaited", view([A, B], [A, B], unregistered=1), 0.5, None,
         "1 replica(s) not registered yet"),
        ("unregistered are not awaited forever", view([A, B], [A, B], unregistered=1), 2.0, {A, B},
         "1 not registered yet"),
        ("fast path ignores unregistered", view([A, B], [A, B], previous=[A, B], unregistered=1), 0, {A, B},
         "fast path"),
    ],
)
def test_rules(name, v, now, members, reason):
    d = compute_quorum(v, now, min_replicas=2, join_timeout_s=2.0)
    assert (set(d.members) if d.members is not None else None) == members, name
    assert reason in d.reason, (name, d.reason)


def test_waiting_gives_a_wake_time():
    d = compute_quorum(view([A, B], [A, B, C], first=3.0), 4.0, min_replicas=2, join_timeout_s=2.0)
    assert d.members is None and d.wake_at == 5.0


@pytest.mark.parametrize("policy, healthy, total, expected", [
    ("none", 1, 4, 1.0), ("linear", 1, 4, 0.25), ("sqrt", 1, 4, 0.5), ("sqrt", 4, 4, 1.0),
    ("sqrt", 3, 12, math.sqrt(0.25)), ("linear", 6, 4, 1.0),
])
def test_lr_scale(policy, healthy, total, expected):
    assert lr_scale(policy, healthy, total) == pytest.approx(expected)


def test_recovery_is_round_robin_per_shard():
    sources = assign_recovery([C, A, B], [D, "e"])
    assert sources == {D: (A, B, C), "e": (B, C, A)}
    # rank r of each behind replica uses sources[r % 3]: shard 0 comes from different replicas
    assert sources[D][0] != sources["e"][0]


def test_form_quorum_ids_change_only_with_membership_or_failed_commit():
    base = dict(lr_policy="sqrt", total_replicas=3, reason="r", now=0.0)
    first = form_quorum({A: 0, B: 0}, previous_id=0, previous_members=frozenset(), failed_commit=False, **base)
    assert first.quorum_id == 1
    same = form_quorum({A: 1, B: 1}, previous_id=1, previous_members=frozenset({A, B}), failed_commit=False, **base)
    assert same.quorum_id == 1
    failed = form_quorum({A: 1, B: 1}, previous_id=1, previous_members=frozenset({A, B}), failed_commit=True, **base)
    assert failed.quorum_id == 2
    grown = form_quorum({A: 3, B: 3, C: 1}, previous_id=2, previous_members=frozenset({A, B}),
                        failed_commit=False, **base)
    assert grown.quorum_id == 3
    assert grown.max_step == 3 and [m.healthy for m in grown.members] == [True, True, False]
    assert grown.recover == {C: (A, B)}
    assert grown.lr_scale == pytest.approx(math.sqrt(2 / 3))


def test_a_member_that_must_resync_is_behind_and_renews_the_rings():
    base = dict(lr_policy="linear", total_replicas=3, reason="fast path", now=0.0)
    q = form_quorum({A: 4, B: 4, C: 4}, previous_id=7, previous_members=frozenset({A, B, C}), failed_commit=False,
                    must_resync=frozenset({B}), **base)
    assert q.quorum_id == 8 and [m.healthy for m in q.members] == [True, False, True]
    assert q.recover == {B: (A, C)} and q.lr_scale == pytest.approx(2 / 3) and q.reason == "fast path"
    # A diverged member below max step is simply behind; it still renews the rings.
    q = form_quorum({A: 4, B: 2}, previous_id=8, previous_members=frozenset({A, B}), failed_commit=False,
                    must_resync=frozenset({B}), **base)
    assert q.quorum_id == 9 and q.recover == {B: (A,)}
    # Nobody at max step holds the reference: the job carries on from what it has, same rings.
    q = form_quorum({A: 2, B: 4}, previous_id=9, previous_members=frozenset({A, B}), failed_commit=False,
                    must_resync=frozenset({B}), **base)
    assert q.quorum_id == 9 and [m.healthy for m in q.members] == [False, True] and q.recover == {A: (B,)}
    assert "no member holds the reference state, so training goes on from the state of b" in q.reason


def test_a_round_that_just_became_quorate_waits_a_moment_for_the_other_survivor():
    """Race 7 of issue 28: c waited alone since t=0; a arrives at t=10, long past the deadline."""
    from controller.core.quorum import QUORATE_SETTLE_S
    v = RoundView(joined={C: 3, A: 5}, first_join_at=0.0, live=frozenset({A, B, C, D}), previous=frozenset())
    assert compute_quorum(v, 10.0, min_replicas=2, join_timeout_s=2.0).quorate is False  # 2 of 4: no majority
    v = RoundView(joined={C: 3, A: 5, B: 5}, first_join_at=0.0, live=frozenset({A, B, C, D}), previous=frozenset(),
                  quorate_at=10.0)
    d = compute_quorum(v, 10.0, min_replicas=2, join_timeout_s=2.0)
    assert d.members is None and d.quorate and d.wake_at == 10.0 + QUORATE_SETTLE_S
    assert compute_quorum(v, 10.0 + QUORATE_SETTLE_S, min_replicas=2, join_timeout_s=2.0).members == {A, B, C}
