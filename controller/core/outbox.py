"""Outbox: the orders for agents that decisions made and the shell has not been handed yet. Pure.

The host registry decides an order (controller.core.hosts) and puts it here; the core hands
the step's orders to the shell in its Ready (`take`), which delivers them once what they follow
from is durable. Orders whose decisions' write failed come back (`put_back`) and go out first
with the next write that succeeds. A decision that sends several orders (a swap, a replica's
restart on 1,000 hosts) collects them in a `batch`, to be announced by one event.

It also numbers the orders: ids grow for as long as the job lives (`order_seq` is durable, and a
new leader without it counts from its clock), so an agent never sees an id twice.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from controller.core.model import OrderOut


class Outbox:
    def __init__(self) -> None:
        self._queued: list[OrderOut] = []
        #: the batches being collected (a decision inside another collects into both)
        self._open: list[list[OrderOut]] = []
        #: the last order id given out (ids are f"o{n}")
        self.order_seq = 0

    def next_id(self) -> str:
        self.order_seq += 1
        return f"o{self.order_seq}"

    def put(self, order: OrderOut) -> None:
        self._queued.append(order)
        for batch in self._open:
            batch.append(order)

    @contextmanager
    def batch(self) -> Iterator[list[OrderOut]]:
        """The orders put while inside, in order (they are queued as any other)."""
        orders: list[OrderOut] = []
        self._open.append(orders)
        try:
            yield orders
        finally:
            self._open.remove(orders)

    def take(self) -> tuple[OrderOut, ...]:
        """Every queued order, handed out (they leave the outbox)."""
        out, self._queued = tuple(self._queued), []
        return out

    def put_back(self, orders) -> None:
        """Orders handed out but not delivered (their decisions' write failed): they go out with
        the next write that succeeds, before any newer ones."""
        self._queued[:0] = list(orders)

    def restore(self, order_seq: int) -> None:
        self.order_seq = order_seq
