"""Which replicas may join: the configured set, at their configured size. A pure rule.

Where agents run the job (some host holds an assignment), the replicas are the ones the hosts
hold: a leader may join a replica whose rank 0 a host holds only with the world size of that
assignment, and a new replica that no host holds only while the job has fewer replicas than
configured (`replicas`). A trainer that starts as another replica (a standby that did not wait for
its assignment and took the defaults, a typo in FTHSDP_REPLICA_ID) or with another rank
count is refused with a message naming the configured replicas, instead of being admitted
as one more member whose FTAR ring cannot match the others'. Replicas started without
agents (no host holds anything) are not checked here: the controller has no other record
of which replicas the job has.
"""

from __future__ import annotations


def join_problem(replica_id: str, world_size: int, held_world_size: int | None, held_ids) -> str:
    """Why this join does not fit the configured replicas ("" when it does). `held_world_size`:
    the world size of the assignment that holds the replica's rank 0 (None: no host holds
    it); `held_ids`: the replica ids hosts hold (only read to name them, or empty)."""
    if held_world_size is None:
        if not held_ids:
            return ""  # no agents: nothing to check against
        names = ", ".join(sorted(held_ids)[:16]) + (", …" if len(held_ids) > 16 else "")
        return (f"replica {replica_id!r} is not one of this job's configured replicas ({names}): no host holds "
                f"it. A trainer must run as the replica its agent assigned (FTHSDP_REPLICA_ID); a warm spare's "
                f"standby must wait for its assignment before it joins.")
    if world_size != held_world_size:
        return (f"replica {replica_id} joined with {world_size} rank(s), but it is configured with "
                f"{held_world_size} (its hosts' assignment): every rank of the replica must be one process of it.")
    return ""
