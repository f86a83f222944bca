"""What one rank does in one step, derived from the controller's quorum answer (pure).

The quorum travels in one shape: the controller's `QuorumResponse`, relayed by the
replica's coordinator to every rank without the members' address lists (the same bytes for
every rank). Rank k needs only column k of them -- rank k of every member is its FTAR peer
and its catch-up source -- so when a quorum's addresses are new the coordinator sends each
rank its own column with the plan (`peers`, see `address_columns`); each rank keeps it in its
`AddressBook`. From answer + book a rank derives its `RankPlan`: its FTAR ring (rank k of
every member, ordered by replica_id), whether its replica is behind and where its rank k
fetches from, whose gradients the sum includes, and whether this step ends with a digest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from fthsdp.errors import PlanError
from protos import controller_pb2 as pb
from protos import replica_pb2 as rpb

# replica_id -> (its rank k's FTAR address, its rank k's state address), for this rank k
Addresses = Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class RankPlan:
    quorum_id: int
    step: int                      # the step trained (max_step; a behind replica jumps to it)
    behind: bool                   # this replica fetches state and contributes zeros
    fetch_from: str                # state address of rank k of the source ("" when healthy)
    source_replica: str
    ftar_group_id: str
    ftar_members: tuple[str, ...]  # rank k of every participant, ordered by replica_id
    included: tuple[str, ...]      # replicas whose gradients the sum includes (the healthy ones)
    divisor: int                   # number of contributing replicas
    lr_scale: float                # the controller's learning-rate factor for this step
    total_replicas: int
    fetchers: tuple[str, ...]      # behind replicas whose rank k fetches from this rank
    report_digest: bool            # every rank digests its committed state after this step
    writes_checkpoint_state: bool  # this replica writes model + optimizer when a checkpoint is due


def address_columns(answer: pb.QuorumResponse, world_size: int) -> list[rpb.PeerAddresses]:
    """Column k of the members' addresses for every rank k (the coordinator's side)."""
    ids = [m.replica_id for m in answer.members]
    ftars = [list(m.ftar_addresses) for m in answer.members]
    states = [list(m.state_addresses) for m in answer.members]
    return [rpb.PeerAddresses(replica_ids=ids, ftar_addresses=[f[k] if k < len(f) else "" for f in ftars],
                              state_addresses=[a[k] if k < len(a) else "" for a in states])
            for k in range(world_size)]


def without_addresses(answer: pb.QuorumResponse) -> pb.QuorumResponse:
    bare = pb.QuorumResponse()
    bare.CopyFrom(answer)
    for m in bare.members:
        del m.ftar_addresses[:]
        del m.state_addresses[:]
    return bare


class AddressBook:
    """This rank's column of the members' addresses, from the last plan that carried it."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, str]] = {}

    def fill(self, plan: rpb.StepPlan) -> Addresses:
        if plan.HasField("peers"):
            p = plan.peers
            self._known = dict(zip(p.replica_ids, zip(p.ftar_addresses, p.state_addresses)))
        missing = [m.replica_id for m in plan.quorum.members if m.replica_id not in self._known]
        if missing:
            raise PlanError(f"quorum {plan.quorum.quorum_id} came without the addresses of {missing}, which this "
                            f"rank never received")
        return self._known


def digest_due(answer: pb.QuorumResponse, replica_id: str, digest_every_steps: int) -> bool:
    """Whether the replica's ranks digest their state after committing this answer's step:
    after a catch-up (it was behind), when it served one (so both sides report the same step),
    and after every N-th step. Every rank of the replica and its coordinator decide alike."""
    me = next((m for m in answer.members if m.replica_id == replica_id), None)
    if me is not None and not me.healthy:
        return True
    if any(replica_id in r.sources_by_shard for r in answer.recover):
        return True
    return digest_every_steps > 0 and (answer.max_step + 1) % digest_every_steps == 0


def plan_for_rank(answer: pb.QuorumResponse, addresses: Addresses, job_id: str, replica_id: str, rank: int,
                  digest_every_steps: int) -> RankPlan:
    """This rank's plan; PlanError names what does not fit (this rank then votes no)."""
    q = answer.quorum_id
    if q <= 0 or answer.max_step < 0:
        raise PlanError(f"quorum answer with quorum_id {q} and max_step {answer.max_step} is not a quorum")
    by_id = {m.replica_id: m for m in answer.members}
    me = by_id.get(replica_id)
    if me is None:
        raise PlanError(f"replica {replica_id} is not among quorum {q}'s members {sorted(by_id)}")
    for m in answer.members:
        if not all(addresses[m.replica_id]):
            raise PlanError(f"member {m.replica_id} of quorum {q} lists no address for rank {rank}")
    healthy = tuple(m.replica_id for m in answer.members if m.healthy)
    if not healthy:
        raise PlanError(f"quorum {q} has no healthy member")
    if not math.isfinite(answer.lr_scale) or answer.lr_scale < 0:
        raise PlanError(f"quorum {q} has lr_scale {answer.lr_scale}, not a finite number >= 0")
    behind = not me.healthy
    fetch_from = source = ""
    if behind:
        sources = next((tuple(r.sources_by_shard) for r in answer.recover if r.replica_id == replica_id), ())
        if not sources:
            raise PlanError(f"replica {replica_id} is behind in quorum {q} but has no source")
        source = sources[rank % len(sources)]
        if source not in by_id or not by_id[source].healthy:
            raise PlanError(f"source {source} of replica {replica_id} is not a healthy member of quorum {q}")
        fetch_from = addresses[source][1]
    fetchers = tuple(sorted(r.replica_id for r in answer.recover
                            if r.sources_by_shard and r.sources_by_shard[rank % len(r.sources_by_shard)] == replica_id))
    return RankPlan(
        quorum_id=q, step=answer.max_step, behind=behind, fetch_from=fetch_from, source_replica=source,
        ftar_group_id=f"{job_id}/rank{rank}",
        ftar_members=tuple(addresses[m.replica_id][0] for m in answer.members),
        included=healthy, divisor=len(healthy), lr_scale=answer.lr_scale or 1.0,
        total_replicas=answer.total_replicas, fetchers=fetchers,
        report_digest=digest_due(answer, replica_id, digest_every_steps),
        writes_checkpoint_state=healthy[0] == replica_id)
