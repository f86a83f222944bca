"""Which state sections a persist must write, and what to do with those whose write failed.

Pure rules over the state's dirty marks; the controller's server does the writing.
"""

from __future__ import annotations

from controller.core.state import ControllerState


def mark_unwritten(state: ControllerState, sections: list[str]) -> None:
    """Sections whose write failed are written again at the next chance."""
    for section in sections:
        kind, _, name = section.partition("/")
        if kind == "replicas":
            state.dirty_replicas = True
        elif kind == "journal":
            state.dirty_journal = True
        elif kind == "addresses":
            state.dirty_addresses.add(name)
        elif kind == "hosts":
            state.dirty_host_shards.add(int(name))
            state.urgent_hosts = True


def sections_due(state: ControllerState, background: bool) -> tuple[bool, bool, bool, bool]:
    """Which sections `persist(background)` writes: addresses, replicas, journal, host shards."""
    return (bool(state.dirty_addresses), bool(state.dirty_replicas),
            bool((background or state.urgent_journal) and state.dirty_journal),
            bool(state.dirty_host_shards and (background or state.urgent_hosts)))


def foreground_writes(state: ControllerState) -> bool:
    """Whether `persist()` (not in the background) has anything to write: what must be
    durable before an answer goes out."""
    return any(sections_due(state, background=False))


__all__ = ["foreground_writes", "mark_unwritten", "sections_due"]
