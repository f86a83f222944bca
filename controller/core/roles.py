"""A host's role is what the durable state says it is now, not the flag its agent started with.

A spare's agent (`--spare`) that was given a replica (a swap's ASSIGN) claims that work when it
registers again: after a controller failover, or after it was forgotten. Pure: no I/O, no clock.
"""

from __future__ import annotations

from controller.core.model import Assignment, Host


def reconcile_spare_claim(claim: Assignment, known: Host | None) -> tuple[Assignment | None, bool]:
    """(the claim to go on with, whether the host registers as a spare) for a `--spare` agent
    that claims `claim`. A host the controller knows (restored from the store) is what its
    record says: the claim is dropped and the record decides, so it keeps the work the store
    gave it, or is a spare when that work moved on; the answer is its current assignment. A
    host the controller does not know (it lost the store, or never had it) is taken at its word
    like any host that claims work: a controller gave it that assignment."""
    if known is not None:
        return None, True
    return claim, False
