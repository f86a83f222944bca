"""The store sections a change left unwritten, by name, and which must be durable first. Pure.

The controller's durable state is cut into sections, each one store value:
- `replicas` (REPLICAS): quorum, replica records, counters, the job's end: small, written
  before every answer that follows from it;
- `addresses/<replica>` (`addresses_section`): a replica's rank addresses, large and rarely
  changed, written before answers too;
- `hosts/<i>` (`host_section`): one shard of the host records; a change is *urgent* (written
  before answering: a registration with its agent secret, a swap, a cordon, a death) or not
  (a repeated registration: written behind, by the ticker);
- `journal` (JOURNAL): recent quorums and events, for the status page: written behind, unless
  it holds a warning or error not yet written.

A component that changes a section marks it here; `ControllerCore.step` takes what is due
into its `Ready` (they leave this ledger then: the shell writes them, or tells back the ones
whose write failed with a `WriteFailed` command, and they are marked again).
"""

from __future__ import annotations

REPLICAS = "replicas"
JOURNAL = "journal"
#: the order sections are written in: a replica's addresses before the replicas that name it
_ORDER = ("addresses", REPLICAS, JOURNAL, "hosts")


def addresses_section(replica_id: str) -> str:
    return f"addresses/{replica_id}"


def host_section(shard: int) -> str:
    return f"hosts/{shard}"


def kind_of(section: str) -> str:
    return section.partition("/")[0]


def _order_key(section: str) -> tuple[int, str]:
    kind, _, name = section.partition("/")
    return _ORDER.index(kind), name.zfill(8) if kind == "hosts" else name


def write_order(sections) -> tuple[str, ...]:
    """`sections` in the order they are written."""
    return tuple(sorted(sections, key=_order_key))


class PendingWrites:
    """Changed sections not yet handed out for writing: section -> urgent."""

    def __init__(self) -> None:
        self._due: dict[str, bool] = {}

    def mark(self, section: str, urgent: bool = True) -> None:
        """`section` changed; `urgent`: it must be durable before the next answer goes out."""
        kind = kind_of(section)
        if kind not in _ORDER:
            raise ValueError(f"unknown store section {section!r}")
        # the replicas and addresses sections are always written before answering
        self._due[section] = self._due.get(section, False) or urgent or kind in (REPLICAS, "addresses")

    def due(self, background: bool) -> tuple[str, ...]:
        """What a write now must hold, in write order: the urgent sections, and with
        `background` (the ticker's write behind) every changed one."""
        return write_order(s for s, urgent in self._due.items() if urgent or background)

    def take(self, background: bool) -> tuple[str, ...]:
        """`due(background)`, handed out: they leave the ledger (see WriteFailed)."""
        out = self.due(background)
        for section in out:
            del self._due[section]
        return out

    def failed(self, sections) -> None:
        """Sections whose write failed are written again at the next chance: before the next
        answer, except the journal (written behind, as always)."""
        for section in sections:
            self.mark(section, urgent=kind_of(section) != JOURNAL)

    def pending(self) -> dict[str, bool]:
        return dict(self._due)

    def clear(self) -> None:
        self._due.clear()

    def __bool__(self) -> bool:
        return bool(self._due)
