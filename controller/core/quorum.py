"""When does a quorum round close, and what does the quorum say? Pure functions.

`compute_quorum(view, now, settings)` decides whether the round closes now: it returns the
members (or None) and a reason a person can read. `form_quorum(...)` turns the members into
the answer: quorum id, max step, healthy and behind, recovery sources and lr scale.
A member that must re-sync (its state diverged from the others') is never healthy while a
member at max step holds the reference state, and it makes the quorum id change (new rings),
as a failed commit does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.core.model import Member, Quorum

#: A round closes on its join timeout no sooner than this after it first had a majority (at
#: most the join timeout itself): survivors of a failure rejoin about at once, a few ms apart.
QUORATE_SETTLE_S = 0.25


@dataclass(frozen=True)
class RoundView:
    #: replica id -> the step it asks to train, for every replica that joined this round
    joined: dict[str, int]
    #: when the first of them joined (None when nobody has)
    first_join_at: float | None
    #: every replica that is not DEAD (joiners included)
    live: frozenset[str]
    #: members of the previous quorum (empty before the first)
    previous: frozenset[str]
    #: configured replicas that have never registered (a job still starting up)
    unregistered: int = 0
    #: replicas that are DEAD (not waited for, but named among the missing)
    dead: frozenset[str] = frozenset()
    #: live replicas whose coordinator's connection closed without goodbye (controller.core.suspects):
    #: not waited for, not counted in the majority, named among the missing
    suspect: frozenset[str] = frozenset()
    #: when this round first had a majority of the live replicas (None: take its first join)
    quorate_at: float | None = None


@dataclass(frozen=True)
class QuorumDecision:
    members: frozenset[str] | None
    reason: str
    #: when to look again if nothing changes (None: only on the next event)
    wake_at: float | None = None
    #: the round has a majority of the live replicas (it may close on the join timeout)
    quorate: bool = False


def _names(ids) -> str:
    return ", ".join(sorted(ids)) or "none"


def _absent(view: RoundView, missing: frozenset[str]) -> str:
    """Everyone a round lacks, by name: live replicas that have not joined, dead ones, and
    how many configured replicas never registered."""
    parts = (sorted(missing) + [f"{r} (dead)" for r in sorted(view.dead - missing)]
             + [f"{r} (suspect)" for r in sorted(view.suspect - missing)])
    if view.unregistered:
        parts.append(f"{view.unregistered} not registered yet")
    return ", ".join(parts) or "none"


def compute_quorum(view: RoundView, now: float, *, min_replicas: int, join_timeout_s: float) -> QuorumDecision:
    if view.suspect:  # suspects count as gone: the rules below see the live set without them
        view = replace(view, live=view.live - view.suspect)
    joined = frozenset(view.joined)
    missing = view.live - joined
    # Nobody asked: nothing to decide.
    if not joined:
        return QuorumDecision(None, "no replica has joined this round")
    # Fast path: the same members as last time, and all of them are here.
    if joined == view.previous and not missing:
        return QuorumDecision(joined, f"fast path: membership unchanged, all {len(joined)} joined")
    # Below the minimum nothing closes, not even on timeout.
    if len(joined) < min_replicas:
        return QuorumDecision(
            None, f"waiting: {len(joined)} joined ({_names(joined)}), min_replicas is {min_replicas}; "
                  f"missing {_absent(view, missing)}"
        )
    # Every live replica is here, and no configured one is still to come: close at once.
    if not missing and not view.unregistered:
        return QuorumDecision(joined, f"all {len(joined)} live replicas joined" + (
            f" ({_names(view.suspect)} suspect: its coordinator's connection closed)" if view.suspect else ""))
    # Split-brain guard: never close with a minority of the live replicas.
    if 2 * len(joined) <= len(view.live):
        return QuorumDecision(
            None,
            f"waiting: {len(joined)} joined ({_names(joined)}) is not a majority of {len(view.live)} live "
            f"replicas; missing {_absent(view, missing)}",
        )
    # Join timeout, counted from the round's first joiner; but never sooner than
    # QUORATE_SETTLE_S after the round first had a majority: a first joiner that waited alone
    # (a restarted replica) must not make survivors a few milliseconds apart close without
    # each other, one of them left to catch up a step.
    deadline = (now if view.first_join_at is None else view.first_join_at) + join_timeout_s
    quorate_at = view.quorate_at if view.quorate_at is not None else view.first_join_at
    settled = (now if quorate_at is None else quorate_at) + min(join_timeout_s, QUORATE_SETTLE_S)
    if now >= deadline and now >= settled:
        return QuorumDecision(
            joined,
            f"join timeout after {join_timeout_s:g}s: {len(joined)} of {len(view.live)} live joined; "
            f"left out {_absent(view, missing)}", quorate=True,
        )
    deadline = max(deadline, settled)
    awaited = _names(missing) if missing else ""
    if view.unregistered:
        awaited += f"{', ' if missing else ''}{view.unregistered} replica(s) not registered yet"
    gone = f" ({_names(view.dead)} dead)" if view.dead else ""
    return QuorumDecision(None, f"waiting up to {deadline - now:.3g}s more for {awaited}{gone}", wake_at=deadline,
                          quorate=True)


def quorate_since(recorded: tuple[float | None, float] | None, first_join_at: float | None) -> float | None:
    """When the round that began at `first_join_at` first had a majority, from what was
    recorded as (first_join_at, then): a record of an earlier round does not count."""
    if recorded is None or first_join_at is None or recorded[0] != first_join_at:
        return None
    return recorded[1]


def lr_scale(policy: str, healthy: int, total: int) -> float:
    """The learning-rate factor for a step trained by `healthy` of `total` replicas."""
    if policy == "none" or total <= 0:
        return 1.0
    fraction = min(healthy, total) / total
    return fraction if policy == "linear" else math.sqrt(fraction)


def assign_recovery(healthy: list[str], behind: list[str]) -> dict[str, tuple[str, ...]]:
    """Round-robin sources per rank shard: rank r of behind replica b fetches from
    sources[b][r % len(healthy)], and each behind replica's rotation starts one further on,
    so no single healthy replica serves every recovering rank."""
    if not healthy:
        return {}
    h = sorted(healthy)
    return {b: tuple(h[(i + s) % len(h)] for s in range(len(h))) for i, b in enumerate(sorted(behind))}


def form_quorum(
    members: dict[str, int],
    *,
    previous_id: int,
    previous_members: frozenset[str],
    failed_commit: bool,
    lr_policy: str,
    total_replicas: int,
    reason: str,
    now: float,
    must_resync: frozenset[str] = frozenset(),
) -> Quorum:
    """Build the answer for `members` (replica id -> step); `must_resync`: members whose
    state diverged, which fetch the state like behind ones."""
    max_step = max(members.values())
    at_max = [r for r, s in members.items() if s == max_step]
    healthy = [r for r in at_max if r not in must_resync]
    if not healthy:
        # Nobody at max step holds the reference: the job goes on from what it has.
        healthy = at_max
        reason += (f"; no member holds the reference state, so training goes on from the state of "
                   f"{', '.join(sorted(at_max))}")
    behind = [r for r in members if r not in healthy]
    changed = frozenset(members) != previous_members
    resync = bool(must_resync & set(behind))
    quorum_id = previous_id + 1 if (changed or failed_commit or resync) else previous_id
    return Quorum(
        quorum_id=quorum_id,
        members=tuple(Member(r, members[r], r in healthy) for r in sorted(members)),
        max_step=max_step,
        recover=assign_recovery(healthy, behind),
        lr_scale=lr_scale(lr_policy, len(healthy), total_replicas),
        reason=reason,
        formed_at=now,
    )
