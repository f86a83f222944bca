"""May this replica join? The answer in one place: every check of a join, in the order asked.

`check_join` asks, of a checked JoinRequest, in this order (the first that fails refuses the
join with its reason, and nothing has changed yet):
1. its own fields (ids, addresses, world size: `ReplicaRegistry.check_join_fields`);
2. its host's right to run the replica's coordinator (`coordinator_host_problem`: fencing);
3. room in the records for a new replica (`ReplicaRegistry.check_room`);
4. the job's state: a job that ended admits nobody (`JobLifecycle.check_join_allowed`);
5. the configured replicas, at their configured size (`replica_set_problem`);
6. the job's history: a step no quorum could have handed out (`step_problem`, asked through
   `Rounds.beyond_history`);
7. its step against its own record: no going back without a failed commit
   (`ReplicaRegistry.check_goes_back`).
What a join then does (a restarted process's old one dies, the record, the round) is
`ControllerState.join`'s.

The configured replicas. Where agents run the job (some host holds an assignment), the
replicas are the ones the hosts hold: a coordinator may join a replica whose rank 0 a host holds
only with the world size of that assignment, and a new replica that no host holds only while the
job has fewer replicas than configured (`replicas`). A trainer that starts as another replica (a
standby that did not wait for its assignment and took the defaults, a typo in FTHSDP_REPLICA_ID)
or with another rank count is refused with a message naming the configured replicas, instead of
being admitted as one more member whose FTAR ring cannot match the others'. Replicas started
without agents (no host holds anything) are not checked here: the controller has no other record
of which replicas the job has.

The step's plausibility. A replica's step comes from the quorums this controller formed: a
member of the quorum for step s trains s and, once it committed, asks for s + 1. So no replica
can honestly ask for more than one past the newest step a quorum handed out (or one past the
newest committed step the job's history holds, if that is newer) -- except a member of the
current quorum after a takeover: a fast-path round (same quorum id, the step after its commit)
is answered without a write, so the old leader may have handed out step s + 1 and died with its
commit report; that member then asks for s + 2. One step more, for members only. A join beyond
that -- a newcomer claiming step 10^9 -- would make it the only holder of "the newest step" and
everyone's catch-up source on its own word; it is refused. A controller with no history at all
(a new job, or an in-memory store that was lost) takes the first quorum's steps as the replicas
say them.

Pure: the rules are functions of their arguments; `check_join` reads the components it is
handed and changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from controller.core.checks import check_optional_id
from controller.core.errors import FailedPrecondition
from controller.core.model import JoinRequest


def check_join(req: JoinRequest, replicas, hosts, lifecycle, rounds, settings):
    """The join checked (FailedPrecondition or another RequestError says why not), in the order
    of this module's docstring; returns the registry's JoinPlan for it. `replicas`, `hosts`,
    `lifecycle` and `rounds` are the state's components, only read."""
    rid, ftar, state = replicas.check_join_fields(req)
    check_coordinator_host(rid, req.host_id, hosts.rank_holders, settings)
    plan = replicas.check_room(rid, req, ftar, state)
    lifecycle.check_join_allowed(rid, plan.record, plan.restarted)
    holder = hosts.hosts.get(hosts.rank_holders.get((rid, 0), ""))
    held = holder.assignment.world_size if holder is not None and holder.assignment is not None else None
    problem = (replica_set_problem(rid, req.world_size, held, hosts.rank_holders, replicas.replicas,
                                   settings.replicas)
               or rounds.beyond_history(rid, req.step))
    if problem:
        raise FailedPrecondition(problem)
    replicas.check_goes_back(plan, req.step)
    return plan


def check_coordinator_host(replica_id: str, host_id: str, rank_holders: Mapping[tuple[str, int], str],
                           settings) -> None:
    """Fencing, for a join and for every coordinator's report: `coordinator_host_problem`."""
    check_optional_id("host_id", host_id, settings.max_id_chars)
    problem = coordinator_host_problem(replica_id, host_id, rank_holders.get((replica_id, 0)))
    if problem:
        raise FailedPrecondition(problem)


# -- the configured replicas -------------------------------------------------------------------

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


# -- the step's plausibility -------------------------------------------------------------------

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
