"""Which spare takes a failed host's work? A pure choice with a reason."""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.model import Host, HostState

#: The label compared to keep a replacement in the failed host's failure domain.
DOMAIN_LABELS = ("zone", "datacenter", "dc")


@dataclass(frozen=True)
class SpareChoice:
    host_id: str | None
    reason: str


def pick_spare(failed: Host, hosts: list[Host]) -> SpareChoice:
    """Prefer a live, uncordoned spare in the failed host's failure domain, then any spare;
    ties go to the lowest host id, so the choice is deterministic."""
    pool = sorted(
        (h for h in hosts if h.state == HostState.SPARE and not h.cordoned and h.host_id != failed.host_id),
        key=lambda h: h.host_id,
    )
    if not pool:
        return SpareChoice(None, f"no spare is free to replace host {failed.host_id}")
    for label in DOMAIN_LABELS:
        domain = failed.labels.get(label)
        if domain is None:
            continue
        for h in pool:
            if h.labels.get(label) == domain:
                return SpareChoice(h.host_id, f"spare {h.host_id} is in the same {label} ({domain})")
        return SpareChoice(pool[0].host_id, f"no spare in {label} {domain}; spare {pool[0].host_id} is the nearest free one")
    return SpareChoice(pool[0].host_id, f"spare {pool[0].host_id} is the first free one")
