"""Replicas whose coordinator's connection closed without goodbye: suspect at once.

A coordinator's connection to the controller (the quorum port, a QuorumStream) that closes while
the coordinator was not done -- its process died, its host vanished, the kernel reset the socket
-- is known in milliseconds, long before the heartbeat timeout. Such a replica is *suspect*:
left out of the live set that a round's majority rule counts, so the survivors form their
quorum in a step instead of waiting `heartbeat_timeout_s` for its death. It stays suspect
until its coordinator joins again, or a heartbeat heard after the loss (its coordinator's own, or
from the host that holds its rank 0) proves it alive. Suspicion is not death: the replica
keeps its state, is not counted in `deaths`, and is declared DEAD only by the usual signals.
Not persisted (a controller that takes over starts without suspects). Time is passed in.
"""

from __future__ import annotations


class Suspects:
    def __init__(self) -> None:
        #: replica id -> when its coordinator's connection was lost
        self.since: dict[str, float] = {}

    def ids(self) -> frozenset[str]:
        return frozenset(self.since)

    def lost(self, replica_id: str, now: float) -> bool:
        """Its coordinator's connection closed without goodbye; True if it was not suspect yet."""
        new = replica_id not in self.since
        self.since[replica_id] = now
        return new

    def cleared(self, replica_id: str) -> bool:
        """It joined again (or left the job): no longer suspect. True if it was."""
        return self.since.pop(replica_id, None) is not None

    def heard(self, replica_id: str, now: float) -> bool:
        """A heartbeat for it arrived at `now`: it clears the suspicion if it came after the loss."""
        since = self.since.get(replica_id)
        if since is None or now <= since:
            return False
        del self.since[replica_id]
        return True
