"""Divergent replicas: digests in, DIVERGED replicas and their re-sync out. Time passed in.

Every committed step a coordinator reports may carry a digest of the replica's state; the ledger
(`controller.core.digests`) compares the digests of one step once every member of the quorum
reported it. A mismatch is one `digest_mismatch` event naming every digest and the replicas
holding it; the replicas outside the reference group become DIVERGED. A DIVERGED replica stays
a member of rounds but is never healthy in a quorum while a replica holding the reference is,
so it gets recovery sources like a behind replica (and new rings: a new quorum id). Its next
commit with `caught_up` makes it HEALTHY again, unless its digest for that step already
disagrees with the reference. What decides DIVERGED is durable: the ledger's pending
comparisons (with the replicas section) and each replica's `must_resync`, which a restart with
a new incarnation does not clear (only re-syncing does).

`DivergenceTracker` owns the ledger and the mismatch count; it reads the replica records it is
handed and returns intents (controller.core.intents): the replicas' moves, events, writes, and
the verdicts for the diagnosis (`Diagnose`), which come first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from controller.core.digests import DigestLedger, Verdict, short
from controller.core.intents import Announce, Diagnose, Intent, MoveReplica, Persist
from controller.core.model import Replica, ReplicaState
from controller.core.pending_writes import REPLICAS
from controller.settings import ControllerSettings


class DivergenceTracker:
    """Replica digests compared per step; who is DIVERGED, and who re-synced."""

    def __init__(self, settings: ControllerSettings) -> None:
        #: recent steps' replica digests, compared per step (bounded; persisted with the replicas)
        self.ledger = DigestLedger(settings.digest_steps_kept, settings.digest_wait_s)
        #: steps whose digests disagreed (persisted)
        self.mismatches = 0

    def committed(self, r: Replica, step: int, digest: str, caught_up: bool, trusted: Callable[[], list[str]],
                  sources: Iterable[str], now: float) -> list[Intent]:
        """After `r` committed `step` with `digest` (already recorded in `r`): keep the digest,
        heal `r` if it re-synced, and judge what can be compared. `trusted()`: the HEALTHY
        replicas but `r`; `sources`: the replicas `r` recovered from in its quorum."""
        verdicts: list[Verdict] = []
        out: list[Intent] = []
        if digest:
            verdicts += self.ledger.record(r.replica_id, step, digest, now)
            out.append(Persist(REPLICAS))  # the pending comparison is durable (DigestLedger.snapshot)
        if (r.state == ReplicaState.DIVERGED or r.must_resync) and caught_up:
            out.append(self._resync(r, step, digest, trusted, sources))
        return out + self.judge(verdicts)

    def compare(self, now: float, waiting: Callable[[int], list[str]]) -> list[Intent]:
        """Decide the steps whose digests are all in, or that waited long enough. `waiting(step)`:
        the members of the current quorum that may still report `step`."""
        if not len(self.ledger):
            return []
        return self.judge(self.ledger.due(now, waiting))

    @staticmethod
    def diverged_members(replicas: Mapping[str, Replica], members) -> frozenset[str]:
        """Members of a forming quorum that must re-sync from the reference state."""
        return frozenset(rid for rid in members if replicas[rid].state == ReplicaState.DIVERGED
                         or replicas[rid].must_resync)  # diverged, then restarted or failed over

    def snapshot(self, budget: int) -> dict:
        return self.ledger.snapshot(budget)

    def restore(self, mismatches: int, ledger: dict | None, now: float) -> None:
        self.mismatches = mismatches
        self.ledger.restore(ledger, now)

    def judge(self, verdicts: list[Verdict]) -> list[Intent]:
        """Mismatches become events and DIVERGED replicas (the diagnosis hears them first)."""
        out: list[Intent] = [Diagnose(tuple(verdicts))] if verdicts else []  # SDC: which hosts differ
        for v in verdicts:
            if not v.mismatch:
                continue
            self.mismatches += 1
            out += [Persist(REPLICAS), Announce("digest_mismatch", ",".join(sorted(v.diverged)),
                                                f"digest mismatch at step {v.step}: {v.holders()}. {v.reason}")]
            keep = dict(v.groups)[v.reference]
            for rid in sorted(v.diverged):
                mine = next(d for d, ids in v.groups if rid in ids)
                why = (f"its digest at step {v.step} ({short(mine)}) differs from the reference "
                       f"{short(v.reference)} held by {', '.join(keep)}")
                if v.tie:
                    why += f" (no majority: the group holding {keep[0]}, the lowest replica id, is the reference)"
                # a dead one re-syncs when it returns; a finished one is done
                out.append(MoveReplica(rid, ReplicaState.DIVERGED, why, unless_settled=True))
        return out

    def _resync(self, r: Replica, step: int, digest: str, trusted: Callable[[], list[str]],
                sources: Iterable[str]) -> Intent:
        expected = self.ledger.expected(step, trusted())
        if digest and expected is not None and digest != expected:
            # The comparison of this step will say so in an event; the reason says it now.
            return MoveReplica(r.replica_id, ReplicaState.DIVERGED,
                               f"re-synced at step {step}, but its digest {short(digest)} still differs from the "
                               f"reference {short(expected)}")
        origin = ", ".join(dict.fromkeys(sources)) or "a healthy replica"
        return MoveReplica(r.replica_id, ReplicaState.HEALTHY, f"re-synced from {origin} and committed step {step}")
