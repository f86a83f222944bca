"""Which restart of its replica a rank's hello belongs to. Pure.

The agent starts every trainer under the controller's replica version of the replica's last
restart (FTHSDP_REPLICA_VERSION); a rank's hello carries it (RankHello.replica_version). Ports
are fixed per host, so while a replica restarts, a new rank can reach the coordinator (or a
relay) of the old restart that is still stopping, and an old rank the new one. Either way they
must not meet:

- the hello is newer than the coordinator: this coordinator is the stopping one; the rank is
  told to retry (its own coordinator comes up at the same address);
- the hello is older: a stale rank of a restart that is over; refused for good.

A version of 0 (a runtime started without an agent, torchrun alone) is not checked.
"""

from __future__ import annotations


def stale_hello(own_version: int, hello_version: int, rank: int) -> tuple[str, bool] | None:
    """(the refusal's reason, whether the rank should retry), or None when they may meet."""
    if not own_version or not hello_version or own_version == hello_version:
        return None
    if hello_version > own_version:
        return (f"rank {rank} was started under replica version {hello_version}, but this coordinator belongs "
                f"to version {own_version}, which is stopping; try again (the new one comes up here)", True)
    return (f"rank {rank} was started under replica version {hello_version}, older than this coordinator's "
            f"{own_version}: a stale process of a restart that is over", False)
