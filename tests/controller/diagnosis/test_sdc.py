"""SDC attribution from digest verdicts and rank digests, and the incident count per host."""

from __future__ import annotations

import pytest

from controller.core.digests import compare
from controller.core.diagnosis.sdc import attribute, check_rank_digests, SdcTracker
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.errors import InvalidArgument

S = DiagnosisSettings(sdc_evict_after=2, sdc_window_s=100.0, sdc_max_hosts=2)
GOOD = ["%016x" % (k + 1) for k in range(4)]


def host_of(rid, rank):
    return f"h-{rid}-{rank // 2}"


def hosts_of(rid):
    return [f"h-{rid}-0", f"h-{rid}-1"]


def digests(corrupt: dict[str, list[int]]):
    """Replica digests and rank digests of r0..r2; ranks in `corrupt[rid]` differ."""
    ranks = {}
    for rid in ("r0", "r1", "r2"):
        ranks[rid] = tuple("deadbeef%08x" % k if k in corrupt.get(rid, []) else GOOD[k] for k in range(4))
    replica = {rid: ("bad0" if corrupt.get(rid) else "5eed") * 8 for rid in ranks}
    return replica, ranks


def test_rank_digests_name_the_host_of_the_differing_rank():
    replica, ranks = digests({"r1": [3]})
    [inc] = attribute(compare(7, replica), ranks, host_of, hosts_of)
    assert (inc.step, inc.replica_id, inc.ranks, inc.hosts, inc.tie) == (7, "r1", (3,), ("h-r1-1",), False)


def test_without_rank_digests_every_host_of_the_replica_is_a_candidate():
    replica, ranks = digests({"r1": [3]})
    [inc] = attribute(compare(7, replica), {"r0": ranks["r0"]}, host_of, hosts_of)
    assert inc.ranks == () and inc.hosts == ("h-r1-0", "h-r1-1")
    f = SdcTracker(S).observe(inc, 0.0)
    assert f.confidence == 0.5 and "no rank digests to compare" in f.summary


def test_a_tie_makes_both_sides_suspects():
    replica = {"r0": "5eed" * 8, "r1": "bad0" * 8}
    ranks = {"r0": tuple(GOOD), "r1": tuple(GOOD[:3]) + ("deadbeef00000003",)}
    incidents = attribute(compare(7, replica), ranks, host_of, hosts_of)
    assert [(i.replica_id, i.hosts, i.tie) for i in incidents] == [("r0", ("h-r0-1",), True), ("r1", ("h-r1-1",), True)]
    f = SdcTracker(S).observe(incidents[1], 0.0)
    assert f.confidence == pytest.approx(0.95 / 2) and any("either side may be corrupt" in e for e in f.evidence)


def test_repeated_minority_counts_per_host_within_the_window():
    tracker = SdcTracker(S)
    replica, ranks = digests({"r1": [2]})
    [inc] = attribute(compare(7, replica), ranks, host_of, hosts_of)
    first = tracker.observe(inc, 0.0)
    second = tracker.observe(inc, 50.0)
    assert (first.count, second.count, first.hosts, first.confidence) == (1, 2, ("h-r1-1",), 0.95)
    assert tracker.incidents("h-r1-1", 120.0) == 1  # the first one aged out of 100 s
    assert "host h-r1-1: 2 digest-minority incident(s)" in second.evidence[1]


def test_a_mismatch_over_many_hosts_is_a_divergence_and_names_nobody():
    replica, ranks = digests({"r1": [0, 1, 2, 3]})
    [inc] = attribute(compare(7, replica), ranks, host_of, lambda rid: [])
    tracker = SdcTracker(DiagnosisSettings(sdc_max_hosts=1))
    f = tracker.observe(inc, 0.0)
    assert f.confidence == 0.0 and f.count == 0 and "software divergence" in f.summary
    assert tracker.incidents("h-r1-0", 0.0) == 0


@pytest.mark.parametrize("bad, world, text", [
    (["ab" * 4] * 3, 4, "has 3 entries but the replica has 4 ranks"),
    (["zz" * 8] * 2, 2, r"rank_digests\[0\] 'zzzzzzzzzzzzzzzz' must be 8..32 hex digits"),
    (["abc"] * 2, 2, "must be 8..32 hex"),
    (["a" * 33] * 2, 2, "must be 8..32 hex"),
])
def test_bad_rank_digests_are_refused_naming_the_value(bad, world, text):
    with pytest.raises(InvalidArgument, match=text):
        check_rank_digests(bad, world)
    assert check_rank_digests(["ABCDEF12"] * 2, 2) == ("abcdef12", "abcdef12") and check_rank_digests([], 5) == ()
