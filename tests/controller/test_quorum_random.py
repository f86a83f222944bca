"""The quorum policy against a deliberately naive, declarative reference."""

import random

from controller.core.quorum import RoundView, assign_recovery, compute_quorum


def reference_closes(joined: set, live: set, previous: set, unregistered: int, waited: float,
                     min_replicas: int, timeout: float) -> bool:
    """One boolean formula, written without the policy's ordered early returns."""
    if not joined:
        return False
    fast = joined == previous and live <= joined
    everyone = live <= joined and unregistered == 0
    majority = 2 * len(joined) > len(live)
    return fast or (len(joined) >= min_replicas and (everyone or (majority and waited >= timeout)))


def test_policy_matches_reference():
    rng = random.Random(1234)
    names = [f"r{i}" for i in range(7)]
    for _ in range(5000):
        live = {n for n in names if rng.random() < 0.7}
        joined = {n for n in live if rng.random() < 0.7}
        previous = {n for n in names if rng.random() < 0.5} if rng.random() < 0.7 else set(joined)
        unregistered = rng.choice([0, 0, 0, 1, 2])
        min_r = rng.randint(1, 4)
        timeout = rng.choice([0.5, 1.0, 5.0])
        first, now = 100.0, 100.0 + rng.choice([0.0, 0.4, 0.5, 1.0, 4.9, 5.0, 9.0])
        v = RoundView({n: 0 for n in joined}, first if joined else None, frozenset(live), frozenset(previous),
                      unregistered)
        d = compute_quorum(v, now, min_replicas=min_r, join_timeout_s=timeout)
        expected = reference_closes(joined, live, previous, unregistered, now - first, min_r, timeout)
        assert (d.members is not None) == expected, (joined, live, previous, unregistered, min_r, timeout, now, d)
        if d.members is not None:
            assert d.members == joined
        assert d.reason


def test_recovery_sources_balance():
    rng = random.Random(7)
    for _ in range(500):
        healthy = [f"h{i}" for i in range(rng.randint(1, 6))]
        behind = [f"b{i}" for i in range(rng.randint(0, 6))]
        sources = assign_recovery(healthy, behind)
        assert set(sources) == set(behind)
        for src in sources.values():
            assert sorted(src) == sorted(healthy)  # every healthy replica serves one shard
        # for any one shard, load is spread: no source serves it for more than ceil(B/H) replicas
        for shard in range(len(healthy)):
            load = {}
            for src in sources.values():
                load[src[shard]] = load.get(src[shard], 0) + 1
            assert max(load.values(), default=0) <= -(-len(behind) // len(healthy))
