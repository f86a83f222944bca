"""What one rank does in one step, derived from a quorum answer (pure).

The leader turns the controller's answer into a `QuorumView` (plain data, JSON for
the intra-replica channel); every rank then derives its own `RankPlan`: its FTAR
group and ring, whether its replica is behind, where rank k fetches state from,
which replicas' gradients the sum includes, and the divisor.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MemberView:
    replica_id: str
    step: int
    healthy: bool
    ftar_addresses: tuple[str, ...]
    state_addresses: tuple[str, ...]


@dataclass(frozen=True)
class QuorumView:
    quorum_id: int
    step: int                      # the step this replica asked to train
    max_step: int
    members: tuple[MemberView, ...]  # ordered by replica_id: the FTAR ring order
    recover: dict[str, tuple[str, ...]]  # behind replica -> sources_by_shard
    lr_scale: float
    total_replicas: int
    reason: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "QuorumView":
        raw = json.loads(text)
        members = tuple(MemberView(m["replica_id"], m["step"], m["healthy"], tuple(m["ftar_addresses"]),
                                   tuple(m["state_addresses"])) for m in raw["members"])
        recover = {k: tuple(v) for k, v in raw["recover"].items()}
        return cls(raw["quorum_id"], raw["step"], raw["max_step"], members, recover, raw["lr_scale"],
                   raw["total_replicas"], raw.get("reason", ""))


@dataclass(frozen=True)
class RankPlan:
    quorum_id: int
    step: int                    # the step trained (max_step; a behind replica jumps to it)
    behind: bool                 # this replica fetches state and contributes zeros
    fetch_from: str              # state address of rank k of the source ("" when healthy)
    source_replica: str
    ftar_group_id: str
    ftar_members: tuple[str, ...]  # rank k of every participant, ordered by replica_id
    included: tuple[str, ...]    # replicas whose gradients the sum includes (the healthy ones)
    divisor: int                 # number of contributing replicas
    healthy_count: int
    lr_scale_from_quorum: float
    total_replicas: int
    fetchers: tuple[str, ...]    # behind replicas whose rank k fetches from this rank


class PlanError(ValueError):
    """The quorum answer does not fit this replica (a bug or a misconfiguration)."""


def plan_for_rank(view: QuorumView, job_id: str, replica_id: str, rank: int) -> RankPlan:
    by_id = {m.replica_id: m for m in view.members}
    me = by_id.get(replica_id)
    if me is None:
        raise PlanError(f"replica {replica_id} is not among quorum {view.quorum_id}'s members "
                        f"{sorted(by_id)}")
    for m in view.members:
        if len(m.ftar_addresses) <= rank or len(m.state_addresses) <= rank:
            raise PlanError(f"member {m.replica_id} of quorum {view.quorum_id} lists no address for rank {rank}")
    healthy = tuple(m.replica_id for m in view.members if m.healthy)
    if not healthy:
        raise PlanError(f"quorum {view.quorum_id} has no healthy member")
    behind = not me.healthy
    fetch_from = source = ""
    if behind:
        sources = view.recover.get(replica_id, ())
        if not sources:
            raise PlanError(f"replica {replica_id} is behind in quorum {view.quorum_id} but has no source")
        source = sources[rank % len(sources)]
        if source not in by_id or not by_id[source].healthy:
            raise PlanError(f"source {source} of replica {replica_id} is not a healthy member")
        fetch_from = by_id[source].state_addresses[rank]
    fetchers = tuple(sorted(b for b, srcs in view.recover.items()
                            if srcs and srcs[rank % len(srcs)] == replica_id))
    return RankPlan(
        quorum_id=view.quorum_id, step=view.max_step, behind=behind, fetch_from=fetch_from,
        source_replica=source, ftar_group_id=f"{job_id}/rank{rank}",
        ftar_members=tuple(m.ftar_addresses[rank] for m in view.members),
        included=healthy, divisor=len(healthy), healthy_count=len(healthy),
        lr_scale_from_quorum=view.lr_scale, total_replicas=view.total_replicas, fetchers=fetchers)
