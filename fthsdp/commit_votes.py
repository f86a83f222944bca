"""Intra-replica two-phase commit: tally the ranks' votes (pure, no I/O, no clock).

Every rank votes once per (quorum_id, step) attempt: yes when its FTAR all-reduce (and,
for a behind replica, its catch-up fetch) finished, no with a reason otherwise. The
leader orders COMMIT only when every rank voted yes for the same attempt; anything
else -- a no, a vote for another attempt, a missing vote after the deadline -- is
RETRY, with the reason naming the first culprit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(enum.Enum):
    COMMIT = "commit"
    RETRY = "retry"
    PENDING = "pending"  # not every rank has voted and the deadline has not passed


@dataclass(frozen=True)
class Vote:
    rank: int
    quorum_id: int
    step: int
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class CommitDecision:
    outcome: Outcome
    reason: str


def tally_votes(votes: dict[int, Vote], world_size: int, quorum_id: int, step: int,
                deadline_passed: bool) -> CommitDecision:
    """Decide the attempt (quorum_id, step) from the votes received so far, keyed by rank."""
    # A no or a vote for another attempt decides at once: waiting cannot turn it into a commit.
    for rank in sorted(votes):
        vote = votes[rank]
        if (vote.quorum_id, vote.step) != (quorum_id, step):
            return CommitDecision(Outcome.RETRY, f"rank {rank} voted for quorum {vote.quorum_id} "
                                                 f"step {vote.step}, not quorum {quorum_id} step {step}")
        if not vote.ok:
            return CommitDecision(Outcome.RETRY, f"rank {rank} voted no: {vote.reason or 'no reason given'}")
    missing = [r for r in range(world_size) if r not in votes]
    # Everyone voted yes: commit.
    if not missing:
        return CommitDecision(Outcome.COMMIT, f"all {world_size} ranks voted yes")
    # Someone is silent past the deadline: treat silence as no.
    if deadline_passed:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        return CommitDecision(Outcome.RETRY, f"{len(missing)} rank(s) did not vote in time: {shown}")
    return CommitDecision(Outcome.PENDING, f"waiting for {len(missing)} vote(s)")
