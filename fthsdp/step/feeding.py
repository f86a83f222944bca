"""The Manager's feeding of its rank's step protocol: events in, effects executed, frames waited for.

fthsdp/manager.py's Manager is a `ProtocolFeed`: the training script's calls feed their events
through `_feed`, which advances the pure protocol (fthsdp/step/protocol.py) and runs each
effect it returns through the Manager's `_EFFECTS` table; `_wait_while` waits (bounded, one
`_pump` at a time) for what can move a blocking step on -- a frame from the coordinator, the
catch-up fetch, a deadline; `_drain` and `_drain_flight` feed what already arrived without
waiting. Frames become events in fthsdp/step/frames.py.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, ClassVar

from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.state.fetch_job import FetchJob
from fthsdp.step import events as ev, frames
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.plan import AddressBook
from fthsdp.step.protocol import INF, Flight, Phase, advance, next_deadline
from fthsdp.step.rank_state import RankState
from fthsdp.telemetry import Collectives


class ProtocolFeed:
    """The feeding half of the Manager (the attributes below are the Manager's)."""

    #: effect type -> handler(manager, effect) -> the event to feed next, or None (fthsdp/manager.py)
    _EFFECTS: ClassVar[dict[type, Callable[[Any, Any], ev.Event | None]]] = {}
    settings: RuntimeSettings
    client: CoordinatorClient | None
    collectives: Collectives
    outer: Any  # fthsdp.sync.outer.OuterSync | None (semi-synchronous)
    sync: Any  # fthsdp.sync.gradients.GradientSync
    protocol_s: float
    protocol_events: int
    _state: RankState
    _fetch: FetchJob | None
    _queue: collections.deque[ev.Event]
    _book: AddressBook

    def _feed(self, event: ev.Event) -> None:
        """Advance the protocol by `event` and execute its effects; events the execution
        produces (a lost channel) are fed after them, in order. A Fail effect raises."""
        self._queue.append(event)
        try:
            while self._queue:
                t0 = time.perf_counter()
                self._state, effects = advance(self._state, self._queue.popleft(), time.monotonic())
                self.protocol_s += time.perf_counter() - t0
                self.protocol_events += 1
                for effect in effects:
                    if (follow := self._EFFECTS[type(effect)](self, effect)) is not None:
                        self._queue.append(follow)
        except BaseException:
            self._queue.clear()  # nothing left over for the next call
            raise

    def _wait_while(self, *phases: Phase) -> None:
        while self._state.phase in phases:
            self._pump()

    def _pump(self) -> None:
        """Wait for the next thing that can move the protocol: a frame, the fetch, a deadline."""
        assert self.client is not None
        deadline = next_deadline(self._state)
        timeout = 1.0 if deadline == INF else max(0.0, deadline - time.monotonic())
        fetch = self._fetch
        try:
            frame = self.client.receive(timeout, fetch.wake_fd if fetch is not None and not fetch.reported else None)
        except ChannelError as exc:
            return self._feed(ev.CoordinatorLost(str(exc)))
        if frame is not None:
            return self._feed(self._event_of(*frame))
        if fetch is not None and fetch.done and not fetch.reported:
            fetch.reported = True
            return self._feed(fetch.event())
        self._feed(ev.Tick())

    def _drain(self) -> None:
        """Feed whatever already arrived, without waiting."""
        while self._state.phase is Phase.TRAINING and (frame := self._receive_now()) is not None:
            self._feed(self._event_of(*frame))

    def _receive_now(self) -> tuple | None:
        """A frame that already arrived, or None (a lost channel is fed as CoordinatorLost)."""
        assert self.client is not None
        try:
            return self.client.receive(0.0)
        except ChannelError as exc:
            self._feed(ev.CoordinatorLost(str(exc)))
            return None

    def _drain_flight(self) -> None:
        """A sync in flight, between inner steps: feed what arrived and the reduce once it is
        done, without waiting, then a Tick for its deadlines (never blocks the trainer)."""
        def flying() -> bool:
            return self._state.flight is not Flight.NONE and self._state.phase is Phase.IDLE
        while flying() and (frame := self._receive_now()) is not None:
            self._feed(self._event_of(*frame))
        if flying() and self._state.flight is Flight.REDUCING:
            if (result := self.outer.poll_reduce(self.sync, wait=False)) is not None:
                self._feed(ev.Reduced(result.ok, result.reason))
        if flying():
            self._feed(ev.Tick())

    def _event_of(self, kind: str, message) -> ev.Event:
        """The frame's event (fthsdp/step/frames.py translates); the telemetry notes its arrival."""
        event = frames.event_of(kind, message, self._book, self.settings)
        if isinstance(event, ev.DecisionArrived):
            self.collectives.decided()
        elif (step := frames.planned_step(event)) is not None:
            self.collectives.planned(step)
        return event
