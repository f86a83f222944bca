"""streaming_diloco's flight waker: moves a fragment sync in flight on while the trainer computes.

With an overlap (settings.overlap_steps >= 1) a fragment's sync runs *in flight* while the
trainer trains its last inner steps (fthsdp/step/protocol.py). Its hops -- the plan arrives,
so the FTAR all-reduce starts; the all-reduce ends, so the rank votes; the decision arrives,
so the commit is held for the due step -- would otherwise wait for the trainer's next call
into the Manager, up to one inner step each. This daemon thread, one per Manager, waits
instead (bounded, never busy): for a frame on the coordinator channel, the started
all-reduce's end (AllReduceHandle.add_done_callback writes to its wake pipe), or the sync's
next deadline, then feeds what arrived through the Manager's `_feed_flight`
(fthsdp/step/feeding.py):

- one lock serialises every feed, the trainer's and the waker's; the waker never holds it
  while it waits, the trainer never while it computes; the coordinator's frames are read
  under it, so by one reader at a time;
- only the sync in flight moves here, and only with effects in `WAKER_EFFECTS` (no effect
  that touches the model's live tensors or runs a collective inside the replica: a
  transition that asks for one raises); a transition that ends the flight or leaves the
  phase (a retry, a refusal, a failure: a lost coordinator) is held for the trainer thread,
  which feeds it at its next call -- so a failure raises there, as the blocking path raises it;
- an error on the waker (a bug, a fatal FTAR error) ends it; the trainer's next Manager call
  raises it; close(), abort() and teardown stop and join it (bounded).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any

from fthsdp.step import events as ev
from fthsdp.step.protocol import INF, Flight, Phase, next_deadline

log = logging.getLogger(__name__)

#: the effects a transition may ask for on the waker: the ring and the reduce's start, the vote
WAKER_EFFECTS = (ev.ConfigureRing, ev.StartReduce, ev.SendVote)
#: how long stopping waits for the waker to end (its waits are at most _POLL_S, its feeds bounded)
WAKER_JOIN_S = 10.0
#: the longest single wait: the loop looks at the state again at least this often
_POLL_S = 1.0
_MOVABLE = (Flight.PLANNING, Flight.REDUCING, Flight.VOTING)


class FlightWaker:
    def __init__(self, manager: Any, name: str) -> None:
        self._m = manager
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._stopping = False
        #: guards the pipe's closing against a late kick (an all-reduce's end after stop)
        self._pipe_lock = threading.Lock()
        self._closed = False
        #: why the waker ended, raised on the trainer thread (None while it runs or after a clean stop)
        self.error: BaseException | None = None
        #: the started reduce whose end already wakes this thread
        self._watched: object = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "FlightWaker":
        self._thread.start()
        return self

    def kick(self) -> None:
        """Look at the state again now (any thread; never blocks)."""
        with self._pipe_lock:
            if self._closed:
                return
            try:
                os.write(self._write, b"\0")
            except BlockingIOError:
                pass  # the pipe is full: a wake is pending already

    def stop(self, timeout_s: float) -> None:
        """End the thread and wait for it (bounded); call it without the Manager's lock."""
        self._stopping = True
        self.kick()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("%s did not end within %gs after stop", self._thread.name, timeout_s)
            return  # its pipe stays open: it may still read it
        with self._pipe_lock:
            self._closed = True
            os.close(self._read)
            os.close(self._write)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wait()
                if not self._stopping:
                    self._m._waker_pass()
        except BaseException as exc:  # handed to the trainer thread (Manager._check_waker)
            log.debug("%s ended: %s", self._thread.name, exc)
            self.error = exc

    def _wait(self) -> None:
        """Until something can move the sync in flight, or _POLL_S; never with the lock."""
        m = self._m
        state, client = m.rank_state, m.client
        fds, timeout = [self._read], _POLL_S
        if (state.flight in _MOVABLE and state.phase in (Phase.IDLE, Phase.INNER) and not m._held
                and client is not None):
            fds.append(client.fileno())
            if state.flight is Flight.REDUCING and m.outer.pending_reduce is not self._watched:
                self._watched = m.outer.pending_reduce
                m.outer.wake_when_reduced(self.kick)
            deadline = next_deadline(state)
            if deadline != INF:
                timeout = min(_POLL_S, max(0.0, deadline - time.monotonic()))
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(int(timeout * 1000) + (1 if timeout > 0 else 0))
        try:
            while os.read(self._read, 512):
                pass
        except BlockingIOError:
            pass
