"""Is a joining replica's step one the job could have reached? Pure.

A replica's step comes from the quorums this controller formed: a member of the quorum for
step s trains s and, once it committed, asks for s + 1. So no replica can honestly ask for more
than one past the newest step a quorum handed out (or one past the newest committed step the
job's history holds, if that is newer) -- except a member of the current quorum after a
takeover: a fast-path round (same quorum id, the step after its commit) is answered without a
write, so the old leader may have handed out step s + 1 and died with its commit report; that
member then asks for s + 2. One step more, for members only. A join beyond that -- a
newcomer claiming step 10^9 -- would make it the only holder of "the newest step" and
everyone's catch-up source on its own word; it is refused. A controller with no history at
all (a new job, or an in-memory store that was lost) takes the first quorum's steps as the
replicas say them.
"""

from __future__ import annotations


def newest_known_step(quorum_max_step: int | None, committed_step: int) -> int:
    """The newest step of the job's history (-1: none)."""
    return max(committed_step, -1 if quorum_max_step is None else quorum_max_step)


def step_problem(replica_id: str, step: int, quorum_max_step: int | None, committed_step: int,
                 member: bool = False) -> str | None:
    """Why `step` is beyond what `replica_id` could have reached, or None. `member`: it is a
    member of the current quorum (its last commit's report may have been lost)."""
    known = newest_known_step(quorum_max_step, committed_step)
    if known < 0 or step <= known + 1 + member:
        return None
    return (f"replica {replica_id} asked to train step {step}, beyond the job's history: the newest step a quorum "
            f"of this controller handed out or committed is {known}, so a replica may ask for at most step "
            f"{known + 1}, a member of the current quorum for {known + 2} (a replica cannot become the catch-up "
            f"source for steps no quorum formed).")
