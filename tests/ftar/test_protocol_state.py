"""The per-rank state table: legal paths work; every illegal event raises and changes nothing."""

from __future__ import annotations

import itertools

import pytest

from ftar_kernels.protocol_state import (
    TRANSITIONS, IllegalTransition, RankEvent, RankProtocol, RankState, next_state,
)

S, E = RankState, RankEvent


def test_one_operation_over_two_partitions_then_a_reconfigure():
    p = RankProtocol()
    path = [(E.CONFIGURE, S.CONFIGURED), (E.START, S.REDUCE_SCATTER), (E.SCATTERED, S.ALL_GATHER),
            (E.NEXT_PARTITION, S.REDUCE_SCATTER), (E.SCATTERED, S.ALL_GATHER), (E.GATHERED, S.DONE),
            (E.START, S.REDUCE_SCATTER), (E.FAIL, S.ABORTED), (E.CONFIGURE, S.CONFIGURED),
            (E.CLOSE, S.CLOSED)]
    for event, want in path:
        assert p.apply(event) is want
        assert p.state is want


@pytest.mark.parametrize("state,event", [
    (s, e) for s, e in itertools.product(RankState, RankEvent) if (s, e) not in TRANSITIONS
])
def test_illegal_event_raises_and_changes_nothing(state, event):
    p = RankProtocol(state)
    with pytest.raises(IllegalTransition, match=event.value):
        p.apply(event)
    assert p.state is state


@pytest.mark.parametrize("state,event,want", [
    (S.IDLE, E.START, None), (S.ABORTED, E.START, None), (S.REDUCE_SCATTER, E.GATHERED, None),
    (S.CLOSED, E.CONFIGURE, None), (S.DONE, E.START, S.REDUCE_SCATTER), (S.ALL_GATHER, E.FAIL, S.ABORTED),
])
def test_table_rows(state, event, want):
    if want is None:
        with pytest.raises(IllegalTransition):
            next_state(state, event)
    else:
        assert next_state(state, event) is want
