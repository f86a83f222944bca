"""The relay tree's layout and its gathering on the way up: tables, and random checks
against a naive reference."""

import math
import random

import pytest

from fthsdp.step.relay_tree import (
    DIRECT_UP_TO_RANKS, BeginGather, DigestGather, GatherError, GroupBegin, GroupDigests, GroupVote, RelayTree,
    VoteGather,
)


@pytest.mark.parametrize("world, fanout, groups, relays", [
    (1, 0, 1, ()),
    (DIRECT_UP_TO_RANKS, 0, 1, ()),          # small replicas: no relays at all
    (DIRECT_UP_TO_RANKS + 1, 0, 8, tuple(range(9, 65, 9))),
    (8192, 0, 91, tuple(range(91, 8192, 91))),
    (10, 4, 3, (4, 8)),                       # the last group is smaller
    (10, 50, 1, ()),                          # a fanout past the world is the world
])
def test_layouts(world, fanout, groups, relays):
    tree = RelayTree.for_world(world, fanout)
    assert tree.groups == groups and tree.relays == relays


@pytest.mark.parametrize("world, fanout, message", [
    (0, 0, "at least 1 rank, got world_size=0"),
    (8, -1, "fanout must be 0 (about sqrt(world_size)) or positive, got -1"),
])
def test_bad_layouts_are_refused_naming_the_value(world, fanout, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RelayTree.for_world(world, fanout)


def test_ranks_out_of_range_are_refused():
    tree = RelayTree.for_world(100)
    with pytest.raises(ValueError, match="rank 100 is not one of 0..99"):
        tree.upstream(100)
    with pytest.raises(ValueError, match="group 10 is not one of 0..9"):
        tree.members(10)


def test_random_layouts_cover_every_rank_once_and_keep_the_coordinator_at_sqrt_n():
    rng = random.Random(18)
    for _ in range(300):
        world = rng.randint(1, 20_000)
        fanout = rng.choice([0, 0, rng.randint(1, world)])
        tree = RelayTree.for_world(world, fanout)
        seen = [r for g in range(tree.groups) for r in tree.members(g)]
        assert seen == list(range(world))  # naive reference: every rank, once, in order
        for rank in rng.sample(range(world), min(world, 20)):
            up = tree.upstream(rank)
            group = tree.group_of(rank)
            assert rank in tree.members(group)
            assert (up is None) == (group == 0) and (up is None or up == tree.members(group)[0])
        assert tree.coordinator_links() == len(tree.members(0)) + len(tree.relays)
        if fanout == 0 and world > DIRECT_UP_TO_RANKS:
            assert tree.coordinator_links() <= 2 * math.isqrt(world) + 3
            assert max(len(tree.members(g)) for g in range(tree.groups)) <= math.isqrt(world) + 1


def test_begins_go_up_once_per_group_and_a_disagreement_is_named():
    g = BeginGather(range(4, 8))
    assert [g.begin(r, 3) for r in (4, 5, 6)] == [[], [], []]
    assert g.begin(6, 3) == []  # said twice
    assert g.begin(7, 3) == [GroupBegin(3, (4, 5, 6, 7))]
    assert [g.begin(r, s) for r, s in ((4, 4), (5, 5), (6, 4))] == [[], [], []]
    assert g.begin(7, 4) == [GroupBegin(4, (4, 6, 7)), GroupBegin(5, (5,))]
    with pytest.raises(GatherError, match="rank 8 is not in this group"):
        g.begin(8, 4)


def test_votes_all_yes_is_one_message_with_sums_and_the_first_no_goes_at_once():
    v = VoteGather(range(4, 7), attempt=9)
    assert v.vote(4, 9, True, loss=1.0, tokens=10) == []
    assert v.vote(4, 9, True, loss=1.0, tokens=10) == []   # said twice: counted once
    assert v.vote(5, 8, False, "old attempt") == []        # another attempt's
    assert v.missing() == (5, 6)
    assert v.vote(5, 9, True, loss=2.0, tokens=20) == []
    assert v.vote(6, 9, True, loss=3.0, tokens=30) == [GroupVote(9, True, (4, 5, 6), "", 6.0, 60)]
    assert v.vote(6, 9, False, "late") == []                # the group's vote is gone
    n = VoteGather(range(4, 7), attempt=10)
    assert n.vote(4, 10, True) == []
    assert n.vote(5, 10, False, "FTAR peer reset") == [GroupVote(10, False, (5,), "rank 5 voted no: FTAR peer reset")]
    assert n.vote(6, 10, True) == [] and n.left(6, "EOF") == []
    gone = VoteGather(range(4, 7), attempt=11)
    assert gone.left(6, "connection reset") == [GroupVote(11, False, (6,), "rank 6 left the replica: connection reset")]


def test_random_votes_match_a_naive_reference():
    rng = random.Random(7)
    for _ in range(500):
        start = rng.randint(0, 50)
        ranks = range(start, start + rng.randint(1, 12))
        v = VoteGather(ranks, attempt=1)
        events = [(r, rng.random() > 0.1) for r in rng.choices(list(ranks), k=rng.randint(1, 3 * len(ranks)))]
        sent = [m for r, ok in events for m in v.vote(r, 1, ok, "x", 1.0, 1)]
        # the naive reference: walk the events; the first no wins unless all said yes before it
        yes, want = set(), []
        for r, ok in events:
            if want:
                break
            if not ok and r not in yes:
                want = [GroupVote(1, False, (r,), f"rank {r} voted no: x")]
            elif ok:
                yes.add(r)
                if yes == set(ranks):
                    want = [GroupVote(1, True, tuple(ranks), "", float(len(ranks)), len(ranks))]
        assert sent == want, (ranks, events)


def test_digests_go_up_in_rank_order_once_all_arrived():
    d = DigestGather(range(2, 5), attempt=3, step=7)
    assert d.digest(4, 3, 7, b"c") == [] and d.digest(2, 3, 7, b"a") == []
    assert d.digest(2, 3, 7, b"again") == [] and d.digest(3, 3, 6, b"old step") == []
    assert d.digest(3, 3, 7, b"b") == [GroupDigests(3, 7, ((2, b"a"), (3, b"b"), (4, b"c")))]


def test_a_flush_sends_up_what_the_members_that_answered_said_and_late_ones_go_alone():
    """Race 8 of issue 28: one silent rank must not silence its relay group."""
    v = VoteGather(range(4, 7), attempt=9)
    assert v.vote(4, 9, True, loss=1.0, tokens=10) == [] and v.vote(6, 9, True, loss=3.0, tokens=30) == []
    assert v.flush() == [GroupVote(9, True, (4, 6), "", 4.0, 40)]
    assert v.flush() == []  # once
    assert v.vote(5, 9, True, loss=2.0, tokens=20) == [GroupVote(9, True, (5,), "", 2.0, 20)]
    assert v.vote(5, 9, False, "late") == [] and v.flush() == []
    n = VoteGather(range(4, 7), attempt=10)
    assert n.vote(4, 10, True) == [] and n.flush() == [GroupVote(10, True, (4,), "", 0.0, 0)]
    assert n.vote(5, 10, False, "reset") == [GroupVote(10, False, (5,), "rank 5 voted no: reset")]
    assert VoteGather(range(4, 7), attempt=1).flush() == []  # nobody voted: nothing to say
    d = DigestGather(range(2, 5), attempt=3, step=7)
    assert d.digest(4, 3, 7, b"c") == [] and d.digest(2, 3, 7, b"a") == []
    assert d.flush() == [GroupDigests(3, 7, ((2, b"a"), (4, b"c")))]
    assert d.digest(3, 3, 7, b"b") == [GroupDigests(3, 7, ((3, b"b"),))] and d.flush() == []
    g = BeginGather(range(4, 8))
    assert [g.begin(r, s) for r, s in ((4, 3), (5, 3), (7, 4))] == [[], [], []]
    assert g.flush() == [GroupBegin(3, (4, 5)), GroupBegin(4, (7,))] and g.flush() == []
    assert g.begin(6, 3) == [GroupBegin(3, (6,))]  # the silent one, late: on its own
    assert [g.begin(r, 5) for r in (4, 5, 6)] == [[], [], []]  # the next round gathers again
    assert g.begin(7, 5) == [GroupBegin(5, (4, 5, 6, 7))]
