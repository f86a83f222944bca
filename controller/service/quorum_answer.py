"""The quorum answer in wire form, built and encoded once per round and shared by every member.

Addresses make the answer large at scale (12 replicas × 8,192 ranks × 2), so each round has
two forms: without addresses (built always: what coordinators that already hold this quorum
id get) and with them (built only when some coordinator asks for it). Addresses cannot change
without a new quorum id, so the bare form is never stale.

Each form is serialized once (`encoded`): the QuorumStream handler sends those bytes as they
are (its response serializer is the identity), so N members on streams cost one
`SerializeToString`, not N. The unary Quorum hands gRPC the shared message instead (`get`).
"""

from __future__ import annotations

from controller.core.model import Quorum
from protos import controller_pb2 as pb


class QuorumAnswers:
    def __init__(self) -> None:
        self._quorum: Quorum | None = None
        self._state = None
        self._quorum_address = ""
        #: with_addresses -> (message, its bytes)
        self._forms: dict[bool, tuple[pb.QuorumResponse, bytes]] = {}

    def prepare(self, q: Quorum, state, quorum_address: str = "") -> None:
        self._quorum, self._state, self._forms = q, state, {}
        self._quorum_address = quorum_address
        self._form(with_addresses=False)

    def get(self, known_quorum_id: int) -> pb.QuorumResponse:
        return self._form(self._needs_addresses(known_quorum_id))[0]

    def encoded(self, known_quorum_id: int) -> bytes:
        return self._form(self._needs_addresses(known_quorum_id))[1]

    def _needs_addresses(self, known_quorum_id: int) -> bool:
        return known_quorum_id != self._quorum.quorum_id

    def _form(self, with_addresses: bool) -> tuple[pb.QuorumResponse, bytes]:
        form = self._forms.get(with_addresses)
        if form is None:
            message = self._build(with_addresses)
            form = self._forms[with_addresses] = (message, message.SerializeToString())
        return form

    def _build(self, with_addresses: bool) -> pb.QuorumResponse:
        q, replicas = self._quorum, self._state.replicas
        members = []
        for m in q.members:
            member = pb.Member(replica_id=m.replica_id, step=m.step, healthy=m.healthy)
            if with_addresses:
                member.ftar_addresses.extend(replicas[m.replica_id].ftar_addresses)
                member.state_addresses.extend(replicas[m.replica_id].state_addresses)
            members.append(member)
        return pb.QuorumResponse(
            quorum_id=q.quorum_id, members=members, max_step=q.max_step, lr_scale=q.lr_scale, reason=q.reason,
            recover=[pb.RecoverAssignment(replica_id=b, sources_by_shard=list(src)) for b, src in sorted(q.recover.items())],
            total_replicas=self._state.settings.replicas, addresses_included=with_addresses,
            resume_checkpoint_step=q.resume_checkpoint_step, quorum_address=self._quorum_address,
            sync_mode=self._state.settings.sync_mode, sync_every_steps=self._state.settings.sync_every_steps,
            sync_fragments=self._state.settings.sync_fragments)
