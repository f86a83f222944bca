"""Divergent replicas: digests in, DIVERGED replicas and their re-sync out. Time passed in.

Every committed step a leader reports may carry a digest of the replica's state; the ledger
(`controller.core.digests`) compares the digests of one step once every member of the quorum
reported it. A mismatch is one `digest_mismatch` event naming every digest and the replicas
holding it; the replicas outside the reference group become DIVERGED. A DIVERGED replica stays
a member of rounds but is never healthy in a quorum while a replica holding the reference is,
so it gets recovery sources like a behind replica (and new rings: a new quorum id). Its next
commit with `caught_up` makes it HEALTHY again, unless its digest for that step already
disagrees with the reference. What decides DIVERGED is durable: the ledger's pending
comparisons (with the replicas section) and each replica's `must_resync`, which a restart with
a new incarnation does not clear (only re-syncing does).
"""

from __future__ import annotations

from controller.core.digests import Verdict, short
from controller.core.model import SETTLED, Replica, ReplicaState
from controller.core.pending_writes import REPLICAS


class DivergenceTracker:
    """Mixin of ControllerState: replica digests, DIVERGED replicas and their re-sync."""

    def _record_digest(self, r: Replica, step: int, digest: str, caught_up: bool, now: float) -> None:
        """After `r` committed `step` (already recorded): keep its digest, heal or compare."""
        verdicts: list[Verdict] = []
        if digest:
            r.digest, r.digest_step = digest, step
            verdicts += self.digest_ledger.record(r.replica_id, step, digest, now)
            self.writes.mark(REPLICAS)  # the pending comparison is durable (DigestLedger.snapshot)
        if (r.state == ReplicaState.DIVERGED or r.must_resync) and caught_up:
            self._resync(r, step, digest, now)
        self._apply_verdicts(verdicts, now)
        self.compare_digests(now)

    def compare_digests(self, now: float) -> None:
        """Decide the steps whose digests are all in, or that waited long enough."""
        if len(self.digest_ledger):
            self._apply_verdicts(self.digest_ledger.due(now, self._digest_waiting), now)

    def diverged_members(self, members) -> frozenset[str]:
        """Members of a forming quorum that must re-sync from the reference state."""
        return frozenset(rid for rid in members if self.replicas[rid].state == ReplicaState.DIVERGED
                         or self.replicas[rid].must_resync)  # diverged, then restarted or failed over

    # -- internals ---------------------------------------------------------------------------

    def _digest_waiting(self, step: int) -> list[str]:
        """Members of the current quorum that may still report `step`."""
        if self.quorum is None:
            return []
        out = []
        for m in self.quorum.members:
            r = self.replicas.get(m.replica_id)
            if r is not None and r.state not in SETTLED and r.committed_step < step:
                out.append(m.replica_id)
        return out

    def _resync(self, r: Replica, step: int, digest: str, now: float) -> None:
        trusted = [x.replica_id for x in self.replicas.values()
                   if x.state == ReplicaState.HEALTHY and x is not r]
        expected = self.digest_ledger.expected(step, trusted)
        if digest and expected is not None and digest != expected:
            # The comparison of this step will say so in an event; the reason says it now.
            self._transition(r, ReplicaState.DIVERGED,
                             f"re-synced at step {step}, but its digest {short(digest)} still differs from the "
                             f"reference {short(expected)}", now)
            return
        sources = self.quorum.recover.get(r.replica_id, ()) if self.quorum else ()
        origin = ", ".join(dict.fromkeys(sources)) or "a healthy replica"
        self._transition(r, ReplicaState.HEALTHY, f"re-synced from {origin} and committed step {step}", now)

    def _apply_verdicts(self, verdicts: list[Verdict], now: float) -> None:
        self.diagnose_verdicts(verdicts, now)  # SDC: which hosts hold the differing state
        for v in verdicts:
            if not v.mismatch:
                continue
            self.digest_mismatches += 1
            self.writes.mark(REPLICAS)
            self._event(now, "digest_mismatch", ",".join(sorted(v.diverged)),
                        f"digest mismatch at step {v.step}: {v.holders()}. {v.reason}")
            keep = dict(v.groups)[v.reference]
            for rid in sorted(v.diverged):
                r = self.replicas.get(rid)
                if r is None or r.state in SETTLED:
                    continue  # a dead one re-syncs when it returns; a finished one is done
                mine = next(d for d, ids in v.groups if rid in ids)
                why = (f"its digest at step {v.step} ({short(mine)}) differs from the reference "
                       f"{short(v.reference)} held by {', '.join(keep)}")
                if v.tie:
                    why += f" (no majority: the group holding {keep[0]}, the lowest replica id, is the reference)"
                self._transition(r, ReplicaState.DIVERGED, why, now)
