"""The event journal: the bounded ring of recent events, kept by level. Time passed in.

Every decision that changes the cluster becomes one `Event` (controller/core/events.py names
the kinds): numbered, kept in a ring of `recent_events` where deaths, swaps and rollbacks
outlive routine news (controller/core/retention.py), and handed once to the service's event
log (`take`). The ring and its numbering are persisted with the journal section.
"""

from __future__ import annotations

from controller.core import retention
from controller.core.checks import clip_text
from controller.core.events import level_of
from controller.core.model import Event


class EventJournal:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.event_seq = 0
        self.tiers: list[int] = []  # how many events of each retention tier the ring holds
        #: events not yet handed to the service's event log (drained by `take`)
        self._fresh: list[Event] = []

    def record(self, now: float, kind: str, subject: str, message: str, cause: str, level: str | None,
               *, max_message_chars: int, keep: int) -> Event:
        self.event_seq += 1
        message = clip_text(message, max_message_chars)
        event = Event(now, kind, subject, message, cause, level or level_of(kind), self.event_seq)
        if len(self.tiers) != retention.TIERS:  # the ring was set anew (restored): count it
            self.tiers = retention.counts(self.events)
        retention.admit(self.events, self.tiers, event, keep)  # kept by level
        self._fresh.append(event)
        return event

    def take(self) -> list[Event]:
        out, self._fresh = self._fresh, []
        return out

    def restore(self, journal: dict) -> None:
        self.events = [Event(*e) for e in journal["events"]]
        self.tiers = []  # counted again on the next event
        self.event_seq = max(journal.get("event_seq", 0), max((e.seq for e in self.events), default=0))
