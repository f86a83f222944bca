"""ControllerView: what the service and the tests read of the controller's state, and nothing else.

The state changes only through `ControllerCore.step` (controller/core/core.py); everybody else
gets this view (`core.view`): named, read-only properties and read methods over the state the
core decides on -- what the REST API, the metrics and the quorum answers show, and what the
store sections hold. It has no verb that changes anything; the records it hands out are the
core's own (read them, never change them: tests/controller/test_one_way_in.py checks the
service and the tests). Pure: no clock, no I/O.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from controller.core import snapshots
from controller.core.model import Event, Host, OrderOut, Quorum, Replica
from controller.core.state import ControllerState
from controller.settings import ControllerSettings


class ControllerView:
    __slots__ = ("_s",)

    def __init__(self, state: ControllerState) -> None:
        self._s = state

    # -- the job -------------------------------------------------------------------------------

    @property
    def settings(self) -> ControllerSettings:
        return self._s.settings

    job_state = property(lambda self: self._s.lifecycle.job_state)
    job_over = property(lambda self: self._s.lifecycle.job_over)
    job_state_reason = property(lambda self: self._s.lifecycle.job_state_reason)
    completed_at = property(lambda self: self._s.lifecycle.completed_at)
    failed_at = property(lambda self: self._s.lifecycle.failed_at)
    job_end_reason = property(lambda self: self._s.lifecycle.job_end_reason)
    stuck_since = property(lambda self: self._s.lifecycle.stuck_since)
    failing_since = property(lambda self: self._s.lifecycle.failing_since)
    exit_causes = property(lambda self: self._s.lifecycle.exit_causes)
    silence_counted_from = property(lambda self: self._s.silence_counted_from)

    def join_refusal(self, replica_id: str) -> str:
        """Why a join of `replica_id` is refused for good now ("" while the job runs)."""
        return self._s.lifecycle.join_refusal(replica_id)

    def silence(self, last_seen: float, now: float) -> str:
        return self._s.silence(last_seen, now)

    # -- replicas ------------------------------------------------------------------------------

    @property
    def replicas(self) -> Mapping[str, Replica]:
        return MappingProxyType(self._s.replica_registry.replicas)

    deaths = property(lambda self: MappingProxyType(self._s.replica_registry.deaths))
    suspects = property(lambda self: self._s.replica_registry.suspects)

    def live_replicas(self) -> frozenset[str]:
        return self._s.replica_registry.live()

    def dead_replicas(self) -> frozenset[str]:
        return self._s.replica_registry.dead()

    def durable_checkpoint(self) -> bool | None:
        return self._s.replica_registry.durable_checkpoint()

    digest_ledger = property(lambda self: self._s.divergence.ledger)
    digest_mismatches = property(lambda self: self._s.divergence.mismatches)

    # -- rounds and quorums --------------------------------------------------------------------

    @property
    def quorum(self) -> Quorum | None:
        return self._s.rounds.quorum

    quorum_history = property(lambda self: tuple(self._s.rounds.quorum_history))
    first_quorum_id = property(lambda self: self._s.rounds.first_quorum_id)
    round_joined = property(lambda self: MappingProxyType(self._s.rounds.round_joined))
    round_first_join_at = property(lambda self: self._s.rounds.round_first_join_at)
    round_reason = property(lambda self: self._s.rounds.round_reason)
    round_wake_at = property(lambda self: self._s.rounds.round_wake_at)
    steps_committed = property(lambda self: self._s.rounds.steps_committed)
    max_committed_step = property(lambda self: self._s.rounds.max_committed_step)
    history_step = property(lambda self: self._s.rounds.history_step)
    history_epoch = property(lambda self: self._s.rounds.history_epoch)
    branch_start_step = property(lambda self: self._s.rounds.branch_start_step)
    newest_checkpoint_step = property(lambda self: self._s.rounds.newest_checkpoint_step)
    steps_lost = property(lambda self: MappingProxyType(self._s.rounds.steps_lost))
    history_changes = property(lambda self: MappingProxyType(self._s.rounds.history_changes))
    rollback_wait_since = property(lambda self: self._s.rounds.rollback_wait_since)

    # -- hosts and orders ----------------------------------------------------------------------

    @property
    def hosts(self) -> Mapping[str, Host]:
        return MappingProxyType(self._s.host_registry.hosts)

    @property
    def rank_holders(self) -> Mapping[tuple[str, int], str]:
        return MappingProxyType(self._s.host_registry.rank_holders)

    replica_versions = property(lambda self: MappingProxyType(self._s.host_registry.replica_versions))
    swaps = property(lambda self: self._s.host_registry.swaps)
    order_seq = property(lambda self: self._s.outbox.order_seq)
    assignment_seq = property(lambda self: self._s.host_registry.assignment_seq)
    version_ceiling = property(lambda self: self._s.host_registry.version_ceiling)

    def authenticate_agent(self, host_id: str, secret: str) -> Host:
        """The host whose agent proves `secret` (PermissionDenied / FailedPrecondition otherwise)."""
        return self._s.host_registry.authenticate_agent(host_id, secret)

    def is_superseded(self, order: OrderOut) -> bool:
        return self._s.host_registry.is_superseded(order)

    def replica_endpoints(self, replica_id: str):
        return self._s.host_registry.replica_endpoints(replica_id)

    def replica_hosts(self, replica_id: str) -> list[Host]:
        return self._s.host_registry.replica_hosts(replica_id)

    def encoded_host_shard(self, shard: int) -> bytes:
        return self._s.host_registry.encoded_host_shard(shard)

    # -- events, goodput, diagnosis ------------------------------------------------------------

    events = property(lambda self: tuple(self._s.journal.events))
    event_seq = property(lambda self: self._s.journal.event_seq)
    #: the goodput tracker, for its read methods (view, timeline, history, failures, snapshot)
    goodput = property(lambda self: self._s.goodput)
    #: the diagnosis engine, for its log, findings and registry
    diagnosis = property(lambda self: self._s.diagnostician.engine)

    # -- the store sections (controller.core.pending_writes names them) ------------------------

    def pending_writes(self) -> dict[str, bool]:
        """The sections changed and not yet handed out in a Ready: section -> urgent."""
        return self._s.writes.pending()

    def snapshot_section(self, which: str) -> dict | bytes:
        return snapshots.section(self._s, which)

    def snapshot_replicas(self) -> dict:
        return snapshots.replicas_section(self._s)

    def snapshot_journal(self) -> dict:
        return snapshots.journal_section(self._s)

    def snapshot_addresses(self, replica_id: str) -> dict:
        return snapshots.addresses_section(self._s, replica_id)

    def snapshot_hosts(self, shard: int) -> dict:
        return snapshots.host_section(self._s, shard)

    def snapshot_host_shards(self, shards) -> dict[int, dict]:
        return snapshots.host_sections(self._s, shards)

    addresses_snapshot = staticmethod(snapshots.addresses_snapshot)


__all__ = ["ControllerView", "Event"]
