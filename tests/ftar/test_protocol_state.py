"""The per-rank state table: legal paths work; every illegal event raises and changes nothing.

And the endpoint decides from the table: an event the table refuses comes back as a named
error (NotReady for an all-reduce, IllegalTransition otherwise), never a silent skip."""

from __future__ import annotations

import itertools

import pytest
import torch

from ftar_kernels import FatalError, FtarEndpoint, FtarSettings, NotReady, RecoverableError
from ftar_kernels.protocol_state import (
    TRANSITIONS, IllegalTransition, RankEvent, RankProtocol, RankState, next_state,
)
from tests.sockets import refused_address

S, E = RankState, RankEvent
KEY = b"protocol-state test key, 32+ bytes long"


def test_one_operation_over_two_partitions_then_a_reconfigure():
    p = RankProtocol()
    path = [(E.CONFIGURE, S.CONNECTING), (E.CONNECTED, S.CONFIGURED), (E.SUBMIT, S.CONFIGURED),
            (E.START, S.REDUCE_SCATTER), (E.SUBMIT, S.REDUCE_SCATTER), (E.SCATTERED, S.ALL_GATHER),
            (E.NEXT_PARTITION, S.REDUCE_SCATTER), (E.SCATTERED, S.ALL_GATHER), (E.GATHERED, S.DONE),
            (E.START, S.REDUCE_SCATTER), (E.FAIL, S.ABORTED), (E.CONFIGURE, S.CONNECTING),
            (E.FAIL, S.ABORTED), (E.CONFIGURE, S.CONNECTING), (E.CONNECTED, S.CONFIGURED),
            (E.CLOSE, S.CLOSED)]
    for event, want in path:
        assert p.apply(event) is want
        assert p.state is want


@pytest.mark.parametrize("state,event", [
    (s, e) for s, e in itertools.product(RankState, RankEvent) if (s, e) not in TRANSITIONS
])
def test_illegal_event_raises_and_changes_nothing(state, event):
    p = RankProtocol(state)
    with pytest.raises(IllegalTransition, match=event.value) as info:
        p.apply(event)
    assert p.state is state
    assert (info.value.state, info.value.event) == (state, event)
    assert isinstance(info.value, FatalError)


@pytest.mark.parametrize("state,event,want", [
    (S.IDLE, E.START, None), (S.ABORTED, E.START, None), (S.REDUCE_SCATTER, E.GATHERED, None),
    (S.CLOSED, E.CONFIGURE, None), (S.REDUCE_SCATTER, E.CONFIGURE, None), (S.CONNECTING, E.SUBMIT, None),
    (S.ABORTED, E.SUBMIT, None), (S.IDLE, E.FAIL, None), (S.CONFIGURED, E.CONNECTED, None),
    (S.DONE, E.START, S.REDUCE_SCATTER), (S.ALL_GATHER, E.FAIL, S.ABORTED), (S.DONE, E.SUBMIT, S.DONE),
])
def test_table_rows(state, event, want):
    if want is None:
        with pytest.raises(IllegalTransition):
            next_state(state, event)
    else:
        assert next_state(state, event) is want


def _endpoint(**kw) -> FtarEndpoint:
    return FtarEndpoint("127.0.0.1", 0, FtarSettings(auth_key=KEY, **kw))


@pytest.mark.parametrize("state", [S.IDLE, S.CONNECTING, S.ABORTED, S.CLOSED])
def test_allreduce_in_a_state_that_refuses_submit_is_not_ready_and_leaves_the_tensor(state):
    ep = _endpoint()
    try:
        ep.protocol = RankProtocol(state)  # the table alone decides: no session is consulted
        x = torch.ones(5)
        with pytest.raises(NotReady, match=f"refuses 'submit' in state '{state.value}'") as info:
            ep.allreduce(x).wait(1.0)
        assert isinstance(info.value, RecoverableError) and info.value.state == state.value
        assert ep.state is state and torch.equal(x, torch.ones(5))
    finally:
        ep.protocol = RankProtocol(S.DONE)
        ep.close()


def test_a_failed_first_configure_is_aborted_by_the_table_and_then_refuses_submit():
    # Before the fix the FAIL from a failed first configure was skipped (IDLE had no FAIL row),
    # so the endpoint stayed IDLE and reported "not configured" for a ring that had failed.
    dead = refused_address()
    ep = _endpoint(connect_timeout_s=0.3)
    try:
        with pytest.raises(RecoverableError, match="could not reach"):
            ep.configure("g", 1, [ep.address, dead])
        assert ep.state is S.ABORTED
        with pytest.raises(NotReady, match="aborted"):
            ep.allreduce(torch.ones(3)).wait(1.0)
        ep.configure("g", 2, [ep.address])
        assert ep.state is S.CONFIGURED
        assert ep.allreduce(torch.ones(3)).wait(1.0).bytes == 12 and ep.state is S.DONE
    finally:
        ep.close()


def test_configure_after_close_is_an_illegal_transition_and_close_is_idempotent():
    ep = _endpoint()
    ep.close()
    with pytest.raises(IllegalTransition, match="'configure' is not allowed in state 'closed'"):
        ep.configure("g", 1, [ep.address])
    ep.close()
    assert ep.state is S.CLOSED


def test_any_failure_while_connecting_aborts_so_the_next_configure_runs():
    # A neighbour address that is not HOST:PORT fails inside the dial with ValueError (not an
    # FtarError); the endpoint must leave CONNECTING (the table has no configure from there).
    ep = _endpoint(connect_timeout_s=0.3)
    try:
        with pytest.raises(ValueError, match="HOST:PORT"):
            ep.configure("g", 1, [ep.address, "no-port-here"])
        assert ep.state is S.ABORTED
        ep.configure("g", 2, [ep.address])
        assert ep.state is S.CONFIGURED
    finally:
        ep.close()
