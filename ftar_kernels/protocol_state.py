"""The per-rank FTAR protocol state as a transition table (pure: no sockets, no clock).

    IDLE --configure--> CONFIGURED --start--> REDUCE_SCATTER --scattered--> ALL_GATHER
    ALL_GATHER --next_partition--> REDUCE_SCATTER      (a tensor larger than one partition)
    ALL_GATHER --gathered--> DONE --start--> REDUCE_SCATTER (the next operation)
    CONFIGURED | DONE --configure--> CONFIGURED         (a new generation)
    CONFIGURED | REDUCE_SCATTER | ALL_GATHER | DONE --fail--> ABORTED --configure--> CONFIGURED
    every state but CLOSED --close--> CLOSED

An event that the table does not list for the current state raises IllegalTransition and leaves
the state unchanged.
"""

from __future__ import annotations

import enum
import threading


class RankState(enum.Enum):
    IDLE = "idle"
    CONFIGURED = "configured"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"
    DONE = "done"
    ABORTED = "aborted"
    CLOSED = "closed"


class RankEvent(enum.Enum):
    CONFIGURE = "configure"
    START = "start"
    SCATTERED = "scattered"
    NEXT_PARTITION = "next_partition"
    GATHERED = "gathered"
    FAIL = "fail"
    CLOSE = "close"


S, E = RankState, RankEvent

TRANSITIONS: dict[tuple[RankState, RankEvent], RankState] = {
    (S.IDLE, E.CONFIGURE): S.CONFIGURED,
    (S.CONFIGURED, E.CONFIGURE): S.CONFIGURED,
    (S.DONE, E.CONFIGURE): S.CONFIGURED,
    (S.ABORTED, E.CONFIGURE): S.CONFIGURED,
    (S.CONFIGURED, E.START): S.REDUCE_SCATTER,
    (S.DONE, E.START): S.REDUCE_SCATTER,
    (S.REDUCE_SCATTER, E.SCATTERED): S.ALL_GATHER,
    (S.ALL_GATHER, E.NEXT_PARTITION): S.REDUCE_SCATTER,
    (S.ALL_GATHER, E.GATHERED): S.DONE,
    (S.CONFIGURED, E.FAIL): S.ABORTED,
    (S.REDUCE_SCATTER, E.FAIL): S.ABORTED,
    (S.ALL_GATHER, E.FAIL): S.ABORTED,
    (S.DONE, E.FAIL): S.ABORTED,
    (S.ABORTED, E.FAIL): S.ABORTED,
    **{(state, E.CLOSE): S.CLOSED for state in RankState if state is not S.CLOSED},
}


class IllegalTransition(RuntimeError):
    """An event arrived that the current state does not accept; nothing changed."""


def next_state(state: RankState, event: RankEvent) -> RankState:
    """The pure decision: the state after `event`, or IllegalTransition."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"event {event.value!r} is not allowed in state {state.value!r}") from None


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
