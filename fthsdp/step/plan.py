"""What one rank does in one step, derived from the controller's quorum answer (pure).

The quorum travels in one shape: the controller's `QuorumResponse`, relayed by the
replica's coordinator to every rank unchanged. The controller leaves member addresses out
when the asker already holds them for that quorum id; each rank keeps an `AddressBook` of
the addresses it last received and derives its own `RankPlan` from answer + book: its FTAR
ring (rank k of every member, ordered by replica_id), whether its replica is behind and
where its rank k fetches from, whose gradients the sum includes, and whether this step
ends with a digest report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from fthsdp.errors import PlanError
from protos import controller_pb2 as pb

# replica_id -> (ftar addresses by rank, state addresses by rank)
Addresses = Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]


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


class AddressBook:
    """Member addresses by replica, from the last answer that carried them."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def fill(self, answer: pb.QuorumResponse) -> Addresses:
        if answer.addresses_included:
            self._known = {m.replica_id: (tuple(m.ftar_addresses), tuple(m.state_addresses))
                           for m in answer.members}
        missing = [m.replica_id for m in answer.members if m.replica_id not in self._known]
        if missing:
            raise PlanError(f"quorum {answer.quorum_id} left out the addresses of {missing}, which this rank "
                            f"never received")
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
        ftar, state = addresses[m.replica_id]
        if len(ftar) <= rank or len(state) <= rank:
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
        fetch_from = addresses[source][1][rank]
    fetchers = tuple(sorted(r.replica_id for r in answer.recover
                            if r.sources_by_shard and r.sources_by_shard[rank % len(r.sources_by_shard)] == replica_id))
    return RankPlan(
        quorum_id=q, step=answer.max_step, behind=behind, fetch_from=fetch_from, source_replica=source,
        ftar_group_id=f"{job_id}/rank{rank}",
        ftar_members=tuple(addresses[m.replica_id][0][rank] for m in answer.members),
        included=healthy, divisor=len(healthy), lr_scale=answer.lr_scale or 1.0,
        total_replicas=answer.total_replicas, fetchers=fetchers,
        report_digest=digest_due(answer, replica_id, digest_every_steps),
        writes_checkpoint_state=healthy[0] == replica_id)
