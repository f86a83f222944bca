"""Pages of large views (hosts, events) for the status API: bounded, and cheap on the loop.

A page holds at most PAGE_MAX items. Hosts are paged by id (`after` = the last id of the
previous page) over a sorted index that is rebuilt only when the number of hosts changes (hosts
are never removed), so a page costs O(log n + page), not a sort of every host. Events are paged
by sequence number (`after` = the last `seq` seen). When more items follow, the answer carries
a `Link: <...>; rel="next"` header (RFC 8288) naming the next page.
"""

from __future__ import annotations

from bisect import bisect_right
from urllib.parse import urlencode

#: The most items one page holds (hosts or events).
PAGE_MAX = 1000


class SortedIds:
    """A sorted index of one state's host ids, kept until the host count changes."""

    def __init__(self) -> None:
        self._state = None
        self._count = -1
        self._ids: list[str] = []

    def of(self, state) -> list[str]:
        if state is not self._state or len(state.hosts) != self._count:
            self._state, self._count = state, len(state.hosts)
            self._ids = sorted(state.hosts)
        return self._ids


def host_page(ids: list[str], after: str, limit: int) -> tuple[list[str], str | None]:
    """The ids after `after` (all from the first when empty), at most `limit` of them, and the
    cursor of the next page (None on the last one)."""
    start = bisect_right(ids, after) if after else 0
    page = ids[start:start + min(limit, PAGE_MAX)]
    more = start + len(page) < len(ids)
    return page, (page[-1] if more and page else None)


def event_page(events: list, after: int | None, limit: int) -> tuple[list, int | None]:
    """Events (oldest first, each with its `seq`): without `after` the newest `limit`, with it
    the first `limit` whose seq is above it; and the cursor of the next page (None when none is
    newer)."""
    limit = min(limit, PAGE_MAX)
    start = max(len(events) - limit, 0) if after is None else bisect_right(events, after, key=lambda e: e.seq)
    chosen = events[start:start + limit]
    more = start + len(chosen) < len(events)
    return chosen, (chosen[-1].seq if more and chosen else None)


def next_link(path: str, **query) -> str:
    return f'<{path}?{urlencode(query)}>; rel="next"'
