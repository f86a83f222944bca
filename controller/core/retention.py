"""Which events the bounded event ring keeps: by level, not by count alone. Pure.

The ring holds at most `recent_events`. When it is full, an event of the lowest tier goes
first, its oldest one, as long as that tier holds more than its floor (a quarter of the ring):
at 12K hosts, registrations (info) never push out the warnings and deaths an operator looks
for, and a flood of warnings never pushes out the deaths, swaps and rollbacks. Tiers, lowest
first: info; other warnings and errors; KEPT_LONGEST (deaths, swaps, rollbacks and the like).
Within a tier the oldest goes first, so the ring stays ordered by `seq`.
"""

from __future__ import annotations

from typing import Sequence

#: The kinds an operator reconstructs an incident from: kept longest.
KEPT_LONGEST = frozenset({"death", "host_death", "host_left", "swap", "no_spare", "rollback", "roll_forward",
                          "digest_mismatch", "job"})
TIERS = 3


def tier(kind: str, level: str) -> int:
    """0: info; 1: other warnings and errors; 2: KEPT_LONGEST."""
    if kind in KEPT_LONGEST:
        return 2
    return 0 if level == "info" else 1


def counts(events: Sequence) -> list[int]:
    """How many of `events` each tier holds."""
    out = [0] * TIERS
    for e in events:
        out[tier(e.kind, e.level)] += 1
    return out


def admit(events: list, tiers: list[int], event, limit: int) -> None:
    """Append `event` to `events` (oldest first, each with .kind and .level; `tiers` is
    counts(events), kept up to date here) and drop what the ring cannot keep. Each drop scans
    only up to the oldest event of the tier it drops from."""
    events.append(event)
    tiers[tier(event.kind, event.level)] += 1
    floor = max(limit // 4, 1)
    while len(events) > limit:
        t = next((t for t in range(TIERS) if tiers[t] > floor), None)
        index = 0 if t is None else next(i for i, e in enumerate(events) if tier(e.kind, e.level) == t)
        gone = events.pop(index)
        tiers[tier(gone.kind, gone.level)] -= 1
