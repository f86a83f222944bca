"""Which replicas may join: the configured set, at their configured size. A pure rule.

Where agents run the job (some host holds an assignment), the replicas are the ones the hosts
hold: a coordinator may join a replica whose rank 0 a host holds only with the world size of that
assignment, and a new replica that no host holds only while the job has fewer replicas than
configured (`replicas`). A trainer that starts as another replica (a standby that did not wait for
its assignment and took the defaults, a typo in FTHSDP_REPLICA_ID) or with another rank
count is refused with a message naming the configured replicas, instead of being admitted
as one more member whose FTAR ring cannot match the others'. Replicas started without
agents (no host holds anything) are not checked here: the controller has no other record
of which replicas the job has.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


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


def coordinator_host_problem(replica_id: str, host_id: str, holder: str | None) -> str:
    """Fencing: only the host that holds rank 0 of a replica (`holder`; None: no host does) may
    run its coordinator, and the coordinator of such a replica must say which host it runs on."""
    if holder is None or holder == host_id:
        return ""
    if not host_id:
        return (f"replica {replica_id}'s coordinator named no host_id, but host {holder} holds its rank 0: "
                f"a coordinator must name its host (FTHSDP_HOST_ID).")
    return (f"host {host_id} does not hold rank 0 of replica {replica_id} (host {holder} does): "
            f"a trainer left on a replaced host must stop.")


def replica_set_problem(replica_id: str, world_size: int, held_world_size: int | None,
                        rank_holders: Mapping[tuple[str, int], str], known_ids: Collection[str],
                        configured: int) -> str:
    """`join_problem` as a join meets it: `held_world_size` as there; `rank_holders`: (replica,
    rank) -> host, for every rank a host holds; `known_ids`: the replicas the controller has a
    record of. A replica no host holds may still join while the job has room in its configured
    count (`configured`): a replica without agents (torchrun)."""
    if held_world_size == world_size or (held_world_size is None and (not rank_holders or replica_id in known_ids)):
        return ""
    held_ids = {r for (r, k) in rank_holders if k == 0}  # read only when the quick answers above fail
    if held_world_size is None and len(held_ids | set(known_ids)) < configured:
        return ""  # room left in the configured count
    return join_problem(replica_id, world_size, held_world_size, held_ids)
