"""The controller's durable store: a small interface and the embedded in-memory default.

Two operations carry all durability: `get(key) -> Versioned` and compare-and-set on a
revision, `cas(key, value, expected_revision, leadership) -> new revision | None`. A write
also carries the writer's `Leadership`; the store refuses it once that leadership is lost
(fencing), so a deposed controller cannot overwrite its successor.

Leader election: `campaign(candidate, ttl_s)` returns once the candidate leads, with a
`Leadership` whose `lost` event is set when its lease ends. Exactly one leader at a time.

The in-memory store is the default for a single controller; `controller.etcd_store` is the
highly-available one. Both pass `tests/store/test_store_contract.py`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol


class StoreError(Exception):
    """The store could not be reached or answered badly; the caller may retry later."""


@dataclass(frozen=True)
class Versioned:
    """A value and its revision; revision 0 and value None mean the key is absent."""

    value: bytes | None
    revision: int


@dataclass
class Leadership:
    """Proof of leadership, carried by every write. `lost` is set when the lease ends."""

    candidate: str
    fence: object
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class Store(Protocol):
    async def get(self, key: str) -> Versioned: ...

    async def cas(
        self, key: str, value: bytes, expected_revision: int, leadership: Leadership
    ) -> int | None:
        """Write `value` if the key is still at `expected_revision` (0: must be absent) and
        `leadership` still holds. Returns the new revision, or None when refused."""
        ...

    async def campaign(self, candidate: str, ttl_s: float) -> Leadership:
        """Wait until `candidate` leads; the caller bounds the wait with asyncio.wait_for."""
        ...

    async def leader(self) -> str | None:
        """The current leader's candidate name, or None."""
        ...

    async def resign(self, leadership: Leadership) -> None: ...

    async def close(self) -> None: ...


class MemoryStore:
    """The embedded default: one process, no durability beyond its life."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, int]] = {}
        self._revision = 0
        self._leader: Leadership | None = None
        self._leader_free = asyncio.Condition()

    async def get(self, key: str) -> Versioned:
        value, revision = self._data.get(key, (None, 0))
        return Versioned(value, revision)

    async def cas(
        self, key: str, value: bytes, expected_revision: int, leadership: Leadership
    ) -> int | None:
        if self._leader is not leadership or leadership.lost.is_set():
            return None
        current = self._data.get(key, (None, 0))[1]
        if current != expected_revision:
            return None
        self._revision += 1
        self._data[key] = (value, self._revision)
        return self._revision

    async def campaign(self, candidate: str, ttl_s: float) -> Leadership:
        async with self._leader_free:
            await self._leader_free.wait_for(lambda: self._leader is None)
            self._leader = Leadership(candidate=candidate, fence=candidate)
            return self._leader

    async def leader(self) -> str | None:
        return self._leader.candidate if self._leader else None

    async def resign(self, leadership: Leadership) -> None:
        async with self._leader_free:
            if self._leader is leadership:
                leadership.lost.set()
                self._leader = None
                self._leader_free.notify_all()

    async def close(self) -> None:
        if self._leader is not None:
            await self.resign(self._leader)
