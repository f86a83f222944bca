"""Which spare takes a failed host's work? A pure choice with a reason."""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.model import Host, HostState

#: The labels compared to keep a replacement near the failed host, narrowest first: its block
#: (or rack: the same switch), then its zone (or datacenter). An empty value says nothing.
DOMAIN_LABELS = ("block", "rack", "zone", "datacenter", "dc")


@dataclass(frozen=True)
class SpareChoice:
    host_id: str | None
    reason: str


def pick_spare(failed: Host, hosts: list[Host]) -> SpareChoice:
    """Prefer a live, uncordoned spare in the failed host's narrowest domain that has one
    (block, rack, zone, datacenter), then any spare; ties go to the lowest host id, so the
    choice is deterministic."""
    pool = sorted(
        (h for h in hosts if h.state == HostState.SPARE and not h.cordoned and h.host_id != failed.host_id),
        key=lambda h: h.host_id,
    )
    if not pool:
        return SpareChoice(None, f"no spare is free to replace host {failed.host_id}")
    missed = ""  # the narrowest domain of the failed host's that had no free spare
    for label in DOMAIN_LABELS:
        domain = failed.labels.get(label)
        if not domain:
            continue
        for h in pool:
            if h.labels.get(label) == domain:
                return SpareChoice(h.host_id, f"spare {h.host_id} is in the same {label} ({domain})")
        missed = missed or f"{label} {domain}"
    if missed:
        return SpareChoice(pool[0].host_id, f"no spare in {missed}; spare {pool[0].host_id} is the nearest free one")
    return SpareChoice(pool[0].host_id, f"spare {pool[0].host_id} is the first free one")
