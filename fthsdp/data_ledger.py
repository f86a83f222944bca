"""The data ledger: every replica's position in its own data stream (pure).

The ledger is replicated state: it travels with catch-up and checkpoints. On the
commit of a step it advances the position of every replica whose gradient was
*included* in that step's sum -- including a replica that aborted the step itself;
that replica takes its advanced position from the ledger it fetches when it
catches up, so it never trains that batch again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")

MAX_LEDGER_CHARS = 16 << 20
MAX_REPLICA_ID_CHARS = 128


@dataclass(frozen=True)
class DataLedger:
    """Immutable: `advanced` returns a new ledger."""

    positions: dict[str, int] = field(default_factory=dict)

    def position(self, replica_id: str) -> int:
        """Next unread position of `replica_id`'s stream (0 for a replica never included)."""
        return self.positions.get(replica_id, 0)

    def advanced(self, included: Iterable[str], batches: int = 1) -> "DataLedger":
        """The ledger after a commit that included these replicas' gradients (each once), each
        having trained `batches` batches for it (a semi-synchronous sync: its inner steps)."""
        new = dict(self.positions)
        for replica_id in set(included):
            new[replica_id] = new.get(replica_id, 0) + batches
        return DataLedger(new)

    def to_json(self) -> str:
        return json.dumps({"positions": dict(sorted(self.positions.items()))}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DataLedger":
        """Parse and check a ledger (it may come from a peer): ValueError names what is wrong."""
        if len(text) > MAX_LEDGER_CHARS:
            raise ValueError(f"a data ledger of {len(text)} characters is longer than {MAX_LEDGER_CHARS}")
        raw = json.loads(text)
        positions = raw.get("positions") if isinstance(raw, dict) else None
        if not isinstance(positions, dict) or not all(
                isinstance(k, str) and 0 < len(k) <= MAX_REPLICA_ID_CHARS and type(v) is int and v >= 0
                for k, v in positions.items()):
            raise ValueError(f"not a data ledger: {text[:200]!r}")
        return cls(dict(positions))


class LedgerBatches(Generic[T]):
    """One replica's batches, read at its ledger position, one per step attempt.

    Each `next()` first calls `begin()` (which starts the step: quorum, plan, catch-up);
    when it returns False the replica has no more steps and the iteration ends. The
    position is never advanced here: a retried step yields the same batch again, a
    committed one moves on, a caught-up replica continues where the ledger it fetched
    says. `batch_at(replica_id, position)` must be deterministic. Between two syncs of a
    semi-synchronous replica, `offset()` counts the inner steps since the ledger last moved.
    """

    def __init__(self, ledger_of: Callable[[], DataLedger], replica_id: str,
                 batch_at: Callable[[str, int], T], begin: Callable[[], bool] = lambda: True,
                 offset: Callable[[], int] = lambda: 0) -> None:
        self._ledger_of, self._offset = ledger_of, offset
        self._replica_id = replica_id
        self._batch_at = batch_at
        self._begin = begin
        self.last_position = -1

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if not self._begin():
            raise StopIteration
        self.last_position = self._ledger_of().position(self._replica_id) + self._offset()
        return self._batch_at(self._replica_id, self.last_position)
