"""The Manager's feeding of its rank's step protocol: events in, effects executed, frames waited for.

fthsdp/manager.py's Manager is a `ProtocolFeed`: the training script's calls feed their events
through `_feed`, which advances the pure protocol (fthsdp/step/protocol.py) and runs each
effect it returns through the Manager's `_EFFECTS` table; `_wait_while` waits (bounded, one
`_pump` at a time) for what can move a blocking step on -- a frame from the coordinator, the
catch-up fetch, a deadline; `_drain` and `_drain_flight` feed what already arrived without
waiting. Frames become events in fthsdp/step/frames.py. In streaming_diloco with an overlap the
flight waker (fthsdp/step/flight_waker.py) feeds a sync in flight through `_feed_flight` while
the trainer computes; every feed and every read of the coordinator's frames, the trainer's and
the waker's, holds `_lock`.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, ClassVar

from fthsdp.errors import ChannelError
from fthsdp.settings import RuntimeSettings
from fthsdp.state.fetch_job import FetchJob
from fthsdp.step import events as ev, frames
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.plan import AddressBook
from fthsdp.step.flight_waker import WAKER_EFFECTS, WAKER_JOIN_S, FlightWaker
from fthsdp.step.protocol import INF, Flight, Phase, ProtocolError, advance, next_deadline
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

    @property
    def rank_state(self) -> RankState:
        """The step protocol's state now (frozen: a snapshot; only feeding changes it)."""
        return self._state

    def _init_feed(self) -> None:
        self._queue = collections.deque()
        #: one feeder at a time, the trainer thread or the flight waker, and one reader of the
        #: coordinator's frames: the waker never holds it while it waits, nor the trainer while it
        #: computes; the trainer's _pump holds it while it waits for a frame at a blocking step (the
        #: waker has nothing to move then: it moves a sync only in phase IDLE or INNER)
        self._lock = threading.RLock()
        #: events the flight waker read but may not apply (they end the flight or leave the phase):
        #: the trainer feeds them first at its next _drain_flight, in order
        self._held: collections.deque[ev.Event] = collections.deque()
        self._waker: FlightWaker | None = None

    def _feed(self, event: ev.Event) -> None:
        """Advance the protocol by `event` and execute its effects; events the execution
        produces (a lost channel) are fed after them, in order. A Fail effect raises."""
        with self._lock:
            self._queue.append(event)
            try:
                while self._queue:
                    self._state, effects = self._advance(self._queue.popleft())
                    self._execute(effects)
            except BaseException:
                self._queue.clear()  # nothing left over for the next call
                raise
            finally:
                if self._waker is not None and self._state.flight is not Flight.NONE:
                    self._waker.kick()  # what it waits for may have changed

    def _feed_flight(self, event: ev.Event) -> None:
        """The flight waker's `_feed` (the lock held): only transitions that move the sync in flight
        on -- its plan starting the reduce, the reduce's vote, a commit held -- are applied here;
        one that ends the flight or leaves the phase (a retry, a refusal, a failure, a rollback)
        is held, with every event after it, for the trainer thread's next call."""
        self._queue.append(event)
        try:
            while self._queue:
                event = self._queue.popleft()
                new, effects = self._advance(event)
                if new.phase is not self._state.phase or new.flight is Flight.NONE:
                    self._held.extend((event, *self._queue))
                    return
                wrong = [e for e in effects if type(e) not in WAKER_EFFECTS or getattr(e, "serving", False)]
                if wrong:
                    raise ProtocolError(f"rank {self.settings.rank}: the flight waker may only move a sync in flight "
                                        f"on, but {type(event).__name__} in flight {self._state.flight.name} asks for "
                                        f"{', '.join(type(e).__name__ for e in wrong)}: a bug in the step protocol")
                self._state = new
                self._execute(effects)
        finally:
            self._queue.clear()

    def _advance(self, event: ev.Event) -> tuple[RankState, tuple]:
        """The protocol's next state and effects for `event` (timed and counted; nothing executed)."""
        t0 = time.perf_counter()
        new, effects = advance(self._state, event, time.monotonic())
        self.protocol_s += time.perf_counter() - t0
        self.protocol_events += 1
        return new, effects

    def _execute(self, effects: tuple) -> None:
        """Run each effect through the Manager's table; the events they produce are fed next, in order."""
        for effect in effects:
            if (follow := self._EFFECTS[type(effect)](self, effect)) is not None:
                self._queue.append(follow)

    def _wait_while(self, *phases: Phase) -> None:
        while self._state.phase in phases:
            self._pump()

    def _pump(self) -> None:
        """Wait for the next thing that can move the protocol: a frame, the fetch, a deadline."""
        assert self.client is not None
        deadline = next_deadline(self._state)
        timeout = 1.0 if deadline == INF else max(0.0, deadline - time.monotonic())
        fetch = self._fetch
        with self._lock:  # one reader of the coordinator's frames at a time
            try:
                frame = self.client.receive(timeout, fetch.wake_fd if fetch is not None and not fetch.reported
                                            else None)
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
        with self._lock:
            while self._state.phase is Phase.TRAINING and (frame := self._receive_now(self._feed)) is not None:
                self._feed(self._event_of(*frame))

    def _receive_now(self, feed: Callable[[ev.Event], None]) -> tuple | None:
        """A frame that already arrived, or None (a lost channel is fed as CoordinatorLost)."""
        assert self.client is not None
        try:
            return self.client.receive(0.0)
        except ChannelError as exc:
            feed(ev.CoordinatorLost(str(exc)))
            return None

    def _drain_flight(self) -> None:
        """A sync in flight, between inner steps (the trainer thread): what the flight waker held
        first, then what arrived and the reduce once it is done, without waiting, then a Tick for
        its deadlines (never blocks the trainer)."""
        with self._lock:
            while self._held and self._state.phase is Phase.IDLE:  # in IDLE, as the trainer fed them before
                self._feed(self._held.popleft())
            self._move_flight(self._feed, (Phase.IDLE,))

    def _feed_begin(self) -> None:
        """Begin a step or a sync (the trainer thread). What the flight waker holds is fed first,
        under the same hold of the lock: between a `_drain_flight` and a Begin fed apart, the
        waker could read a sync's decision and hold it, and the Begin would then join that sync
        in a blocking phase and wait for a frame already read, until the decision timeout."""
        with self._lock:
            self._drain_flight()
            self._feed(ev.Begin())

    def _move_flight(self, feed: Callable[[ev.Event], None], phases: tuple[Phase, ...]) -> None:
        """Feed (the lock held) what can move the sync in flight on while the phase is one of `phases`."""
        def flying() -> bool:
            return self._state.flight is not Flight.NONE and self._state.phase in phases and not self._held
        while flying() and (frame := self._receive_now(feed)) is not None:
            feed(self._event_of(*frame))
        if flying() and self._state.flight is Flight.REDUCING:
            if (result := self.outer.poll_reduce(self.sync, wait=False)) is not None:
                feed(ev.Reduced(result.ok, result.reason))
        if flying():
            feed(ev.Tick())

    def _start_waker(self) -> None:
        """streaming_diloco with an overlap: the flight waker moves the sync in flight while the
        trainer computes (sync, local_sgd, diloco and tau = 0 run without one)."""
        s = self.settings
        if s.sync_mode == "streaming_diloco" and s.overlap_steps >= 1:
            self._waker = FlightWaker(self, f"fthsdp-flight-waker-r{s.replica_id}-{s.rank}").start()

    def _stop_waker(self) -> None:
        waker, self._waker = self._waker, None
        if waker is not None:
            waker.stop(WAKER_JOIN_S)

    def _check_waker(self) -> None:
        """A flight waker that died raises its error on the trainer thread (at every call after)."""
        if self._waker is not None and self._waker.error is not None:
            raise self._waker.error

    def _waker_pass(self) -> None:
        """The flight waker's move (fthsdp/step/flight_waker.py calls it when woken)."""
        with self._lock:
            self._move_flight(self._feed_flight, (Phase.IDLE, Phase.INNER))

    def _event_of(self, kind: str, message) -> ev.Event:
        """The frame's event (fthsdp/step/frames.py translates); the telemetry notes its arrival."""
        event = frames.event_of(kind, message, self._book, self.settings)
        if isinstance(event, ev.DecisionArrived):
            self.collectives.decided()
        elif (step := frames.planned_step(event)) is not None:
            self.collectives.planned(step)
        return event
