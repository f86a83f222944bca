"""The pure digest comparison: tables, a naive reference on random inputs, the bounded ledger."""

import random

import pytest

from controller.core.digests import DigestLedger, check_digest, compare, judge_late
from controller.core.errors import InvalidArgument

A, B, C = "a" * 16, "b" * 16, "c" * 16


@pytest.mark.parametrize("name, reports, reference, diverged, tie", [
    ("all equal", {"r0": A, "r1": A, "r2": A}, A, set(), False),
    ("minority of one", {"r0": A, "r1": B, "r2": A}, A, {"r1"}, False),
    ("the lowest id in the minority", {"r0": B, "r1": A, "r2": A}, A, {"r0"}, False),
    ("tie of two: the group of the lowest id stays", {"r0": B, "r1": A}, B, {"r1"}, True),
    ("three-way split", {"r0": C, "r1": A, "r2": B}, C, {"r1", "r2"}, True),
    ("two against two", {"r0": B, "r1": A, "r2": A, "r3": B}, B, {"r1", "r2"}, True),
    ("two groups of two and one alone", {"r0": C, "r1": A, "r2": A, "r3": B, "r4": B}, A, {"r0", "r3", "r4"}, True),
    ("ids in ring (string) order", {"r10": A, "r2": B}, A, {"r2"}, True),
])
def test_compare(name, reports, reference, diverged, tie):
    v = compare(7, reports)
    assert (v.reference, set(v.diverged), v.tie) == (reference, diverged, tie), name
    assert v.mismatch == bool(diverged) and v.groups[0][0] == reference
    assert sorted(r for _, ids in v.groups for r in ids) == sorted(reports)
    if tie and diverged:
        assert "lowest replica id" in v.reason
    if diverged:
        for d, ids in v.groups:  # the event names every digest and who holds it
            assert d in v.holders() and all(r in v.holders() for r in ids)


def test_one_report_is_no_comparison():
    assert compare(3, {"r0": A}) is None and compare(3, {}) is None


def naive(reports):
    """Count, pick the biggest (lowest id on ties), everyone else diverged."""
    counts = {}
    for rid, d in reports.items():
        counts.setdefault(d, []).append(rid)
    best = max(counts.values(), key=len)
    winners = [ids for ids in counts.values() if len(ids) == len(best)]
    keep = min(winners, key=min)
    return reports[keep[0]], set(reports) - set(keep), len(winners) > 1


def test_compare_matches_a_naive_reference():
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randint(2, 7)
        digests = [rng.choice([A, B, C]) for _ in range(n)]
        reports = {f"r{i}": d for i, d in zip(rng.sample(range(20), n), digests)}
        v = compare(1, reports)
        reference, diverged, tie = naive(reports)
        assert (v.reference, set(v.diverged)) == (reference, diverged), reports
        assert v.tie == tie and len(v.groups) == len(set(digests))


@pytest.mark.parametrize("digest, message", [
    ("abc", "is 3 characters; it must be 8..64"),
    ("a" * 65, "is 65 characters"),
    ("0x12345678", "not hexadecimal"),
    ("g" * 16, "not hexadecimal"),
    ("ａ" * 16, "not hexadecimal"),
    ("12345678 ", "not hexadecimal"),
])
def test_bad_digests_are_named(digest, message):
    with pytest.raises(InvalidArgument, match=message):
        check_digest(digest, 64)


def test_good_digests_are_lowered():
    assert check_digest("", 64) == "" and check_digest("ABCDEF0123", 64) == "abcdef0123"


def waiting(table):
    return lambda step: table.get(step, ())


def test_a_step_is_decided_when_nobody_it_waits_for_is_left():
    ledger = DigestLedger(max_steps=4, wait_s=10.0)
    assert ledger.record("r0", 5, A, 0.0) == []
    assert ledger.record("r1", 5, B, 0.1) == []
    assert ledger.due(0.2, waiting({5: ["r2"]})) == []  # r2 may still report step 5
    assert ledger.record("r2", 5, B, 0.3) == []
    [v] = ledger.due(0.3, waiting({}))
    assert v.step == 5 and v.reference == B and v.diverged == {"r0"} and not v.tie
    assert ledger.due(0.4, waiting({})) == []  # decided once


def test_a_step_is_decided_after_wait_s_with_what_is_there():
    ledger = DigestLedger(max_steps=4, wait_s=10.0)
    ledger.record("r0", 5, A, 0.0)
    ledger.record("r1", 5, B, 1.0)
    assert ledger.due(9.9, waiting({5: ["r2"]})) == []
    [v] = ledger.due(10.0, waiting({5: ["r2"]}))
    assert v.tie and v.reference == A and v.diverged == {"r1"}


def test_a_late_report_is_judged_against_the_verdict_that_stands():
    ledger = DigestLedger(max_steps=4, wait_s=1.0)
    ledger.record("r0", 5, A, 0.0)
    ledger.record("r1", 5, A, 0.0)
    [agreed] = ledger.due(0.0, waiting({}))
    assert not agreed.mismatch
    [late] = ledger.record("r2", 5, B, 3.0)
    assert late.reference == A and late.diverged == {"r2"} and "late digest of r2" in late.reason
    assert late.groups == ((A, ("r0", "r1")), (B, ("r2",)))
    [fine] = ledger.record("r3", 5, A, 3.0)
    assert not fine.mismatch and fine.groups[0] == (A, ("r0", "r1", "r3"))
    assert fine.groups[1] == (B, ("r2",))  # the earlier late one is still shown


def test_a_late_report_after_a_lonely_decision_is_compared():
    ledger = DigestLedger(max_steps=4, wait_s=1.0)
    ledger.record("r0", 5, A, 0.0)
    assert ledger.due(2.0, waiting({5: ["r1"]})) == []  # decided alone: nothing to compare
    [v] = ledger.record("r1", 5, B, 3.0)
    assert v.tie and v.diverged == {"r1"}


def test_judge_late_replaces_a_replicas_earlier_digest():
    v = compare(2, {"r0": A, "r1": B})
    again = judge_late(v, "r1", A)
    assert not again.mismatch and again.groups == ((A, ("r0", "r1")),)


def test_memory_is_bounded_and_the_evicted_step_is_decided_first():
    ledger = DigestLedger(max_steps=3, wait_s=100.0)
    ledger.record("r0", 0, A, 0.0)
    ledger.record("r1", 0, B, 0.0)
    out = []
    for step in range(1, 50):
        out += ledger.record("r0", step, A, float(step))
        assert len(ledger) <= 3
    assert [(v.step, set(v.diverged)) for v in out] == [(0, {"r1"})]  # step 0 had to make room
    assert ledger.record("r1", 2, B, 60.0) == []  # older than anything kept: not compared
    assert len(ledger) == 3
    assert ledger.expected(48, ["r0"]) == A and ledger.expected(48, ["r9"]) is None
    assert ledger.expected(2, ["r0"]) is None


def test_a_decided_step_that_makes_room_gives_no_second_verdict():
    """A mismatch decided when its step was due is not decided again when the step leaves the
    ledger (a second verdict re-marked a re-synced replica DIVERGED and counted a second SDC
    incident against whichever host holds the replica by then)."""
    ledger = DigestLedger(max_steps=2, wait_s=100.0)
    for rid, digest in (("r0", A), ("r1", A), ("r2", B)):
        ledger.record(rid, 0, digest, 0.0)
    [verdict] = ledger.due(0.0, waiting({}))
    assert verdict.step == 0 and verdict.diverged == {"r2"}
    out = [v for step in range(1, 6) for v in ledger.record("r0", step, A, float(step))]
    assert out == [] and len(ledger) == 2


def test_expected_prefers_the_decided_reference_then_the_trusted_majority():
    ledger = DigestLedger(max_steps=4, wait_s=100.0)
    ledger.record("r0", 1, A, 0.0)
    ledger.record("r1", 1, B, 0.0)
    ledger.record("r2", 1, B, 0.0)
    assert ledger.expected(1, ["r0", "r1", "r2"]) == B
    assert ledger.expected(1, ["r0"]) == A
    ledger.due(0.0, waiting({}))
    assert ledger.expected(1, ["r0"]) == B


def test_ledger_settings_are_checked():
    with pytest.raises(ValueError, match="max_steps >= 1 and wait_s > 0, got 0 and 1.0"):
        DigestLedger(0, 1.0)
