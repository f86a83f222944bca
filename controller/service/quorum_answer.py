"""The quorum answer in wire form, built once per quorum and shared by every member.

Addresses make the answer large at scale (12 replicas × 8,192 ranks), so each quorum has
two prepared forms: with addresses, and without them for leaders that already hold this
quorum id."""

from __future__ import annotations

from controller.core.model import Quorum
from protos import controller_pb2 as pb


class QuorumAnswers:
    def __init__(self) -> None:
        self._quorum_id = 0
        self._full: pb.QuorumResponse | None = None
        self._bare: pb.QuorumResponse | None = None

    def prepare(self, q: Quorum, state) -> None:
        total = state.settings.replicas
        recover = [pb.RecoverAssignment(replica_id=b, sources_by_shard=list(src)) for b, src in sorted(q.recover.items())]
        common = dict(quorum_id=q.quorum_id, max_step=q.max_step, recover=recover, lr_scale=q.lr_scale,
                      reason=q.reason, total_replicas=total)
        full_members, bare_members = [], []
        for m in q.members:
            r = state.replicas[m.replica_id]
            full_members.append(pb.Member(replica_id=m.replica_id, step=m.step, healthy=m.healthy,
                                          ftar_addresses=list(r.ftar_addresses),
                                          state_addresses=list(r.state_addresses)))
            bare_members.append(pb.Member(replica_id=m.replica_id, step=m.step, healthy=m.healthy))
        self._quorum_id = q.quorum_id
        self._full = pb.QuorumResponse(members=full_members, addresses_included=True, **common)
        self._bare = pb.QuorumResponse(members=bare_members, addresses_included=False, **common)

    def get(self, known_quorum_id: int) -> pb.QuorumResponse:
        return self._bare if known_quorum_id == self._quorum_id else self._full
