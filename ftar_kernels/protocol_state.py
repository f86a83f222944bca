"""The per-rank FTAR protocol state as a transition table (pure: no sockets, no clock).

This table is the endpoint's decision, not a picture of it: `FtarEndpoint` applies an event
before it acts (configure, submit, run, close) and acts only when the table accepts it.

    IDLE | CONFIGURED | DONE | ABORTED --configure--> CONNECTING  (the old generation is joined first)
    CONNECTING --connected--> CONFIGURED                          (the new ring is up)
    CONFIGURED | REDUCE_SCATTER | ALL_GATHER | DONE --submit--> (unchanged)   (queue an all-reduce)
    CONFIGURED | DONE --start--> REDUCE_SCATTER --scattered--> ALL_GATHER
    ALL_GATHER --next_partition--> REDUCE_SCATTER                 (a tensor larger than one partition)
    ALL_GATHER --gathered--> DONE
    CONNECTING | CONFIGURED | REDUCE_SCATTER | ALL_GATHER | DONE | ABORTED --fail--> ABORTED
    every state but CLOSED --close--> CLOSED

An event that the table does not list for the current state raises IllegalTransition (a
FatalError: our own code asked for something the protocol forbids) and leaves the state unchanged.
The endpoint turns an illegal `submit` into the RecoverableError its caller handles (not
configured, connecting, aborted or closed), because that one is the caller's timing, not a bug.
"""

from __future__ import annotations

import enum
import threading

from .errors import FatalError


class RankState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    CONFIGURED = "configured"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"
    DONE = "done"
    ABORTED = "aborted"
    CLOSED = "closed"


class RankEvent(enum.Enum):
    CONFIGURE = "configure"
    CONNECTED = "connected"
    SUBMIT = "submit"
    START = "start"
    SCATTERED = "scattered"
    NEXT_PARTITION = "next_partition"
    GATHERED = "gathered"
    FAIL = "fail"
    CLOSE = "close"


S, E = RankState, RankEvent

TRANSITIONS: dict[tuple[RankState, RankEvent], RankState] = {
    **{(state, E.CONFIGURE): S.CONNECTING for state in (S.IDLE, S.CONFIGURED, S.DONE, S.ABORTED)},
    (S.CONNECTING, E.CONNECTED): S.CONFIGURED,
    **{(state, E.SUBMIT): state for state in (S.CONFIGURED, S.REDUCE_SCATTER, S.ALL_GATHER, S.DONE)},
    (S.CONFIGURED, E.START): S.REDUCE_SCATTER,
    (S.DONE, E.START): S.REDUCE_SCATTER,
    (S.REDUCE_SCATTER, E.SCATTERED): S.ALL_GATHER,
    (S.ALL_GATHER, E.NEXT_PARTITION): S.REDUCE_SCATTER,
    (S.ALL_GATHER, E.GATHERED): S.DONE,
    **{(state, E.FAIL): S.ABORTED
       for state in (S.CONNECTING, S.CONFIGURED, S.REDUCE_SCATTER, S.ALL_GATHER, S.DONE, S.ABORTED)},
    **{(state, E.CLOSE): S.CLOSED for state in RankState if state is not S.CLOSED},
}


class IllegalTransition(FatalError):
    """An event arrived that the current state does not accept; nothing changed."""

    def __init__(self, state: RankState, event: RankEvent) -> None:
        super().__init__(f"event {event.value!r} is not allowed in state {state.value!r}")
        self.state, self.event = state, event


def next_state(state: RankState, event: RankEvent) -> RankState:
    """The pure decision: the state after `event`, or IllegalTransition."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event) from None


class RankProtocol:
    """Thread-safe holder of one rank's state; `apply` is the only way to change it."""

    def __init__(self, state: RankState = RankState.IDLE) -> None:
        self._state = state
        self._lock = threading.Lock()

    @property
    def state(self) -> RankState:
        return self._state

    def apply(self, event: RankEvent) -> RankState:
        with self._lock:
            self._state = next_state(self._state, event)
            return self._state
