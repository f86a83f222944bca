"""ControllerView: what the service and the tests read of the controller's state, and nothing else.

The state changes only through `ControllerCore.step` (controller/core/core.py); everybody else
gets this view (`core.view`): named, read-only properties and read methods over the state the
core decides on -- what the REST API, the metrics and the quorum answers show, and what the
store sections hold. It has no verb that changes anything, and no property can be set; the
records it hands out are the core's own (read them, never change them:
tests/controller/test_one_way_in.py checks the service and the tests). Pure: no clock, no I/O.

Most properties pass one attribute of the state through as it is (`PASSED_THROUGH`) or behind a
read-only mapping (`PASSED_AS_MAPPINGS`): name -> where it lives in the state.
"""

from __future__ import annotations

from operator import attrgetter
from types import MappingProxyType
from typing import Mapping

from controller.core import snapshots
from controller.core.model import Host, OrderOut, Quorum, Replica
from controller.core.state import ControllerState
from controller.settings import ControllerSettings

#: view name -> the state's attribute it shows as it is (the job's ending, the rounds' counters, ...)
PASSED_THROUGH = {
    **{name: f"lifecycle.{name}" for name in (
        "job_state", "job_over", "job_state_reason", "completed_at", "failed_at", "job_end_reason", "stuck_since",
        "failing_since", "exit_causes")},
    **{name: f"rounds.{name}" for name in (
        "first_quorum_id", "round_first_join_at", "round_reason", "round_wake_at", "steps_committed",
        "max_committed_step", "history_step", "history_epoch", "branch_start_step", "newest_checkpoint_step",
        "rollback_wait_since")},
    **{name: f"host_registry.{name}" for name in ("swaps", "assignment_seq", "version_ceiling")},
    "silence_counted_from": "silence_counted_from",
    "suspects": "replica_registry.suspects",
    "digest_ledger": "divergence.ledger",
    "digest_mismatches": "divergence.mismatches",
    "order_seq": "outbox.order_seq",
    "event_seq": "journal.event_seq",
    #: the goodput tracker, for its read methods (view, timeline, history, failures, snapshot)
    "goodput": "goodput",
    #: the diagnosis engine, for its log, findings and registry
    "diagnosis": "diagnostician.engine",
}
#: view name -> the state's dict it shows as a read-only mapping
PASSED_AS_MAPPINGS = {
    "deaths": "replica_registry.deaths",
    "round_joined": "rounds.round_joined",
    "steps_lost": "rounds.steps_lost",
    "history_changes": "rounds.history_changes",
    "replica_versions": "host_registry.replica_versions",
}


def _as_mapping(path: str) -> property:
    get = attrgetter(path)
    return property(lambda self: MappingProxyType(get(self)), doc=f"the state's {path.split('.', 1)[1]}, read-only")


class ControllerView:
    __slots__ = ("_s",)

    def __init__(self, state: ControllerState) -> None:
        self._s = state

    @property
    def settings(self) -> ControllerSettings:
        return self._s.settings

    def join_refusal(self, replica_id: str) -> str:
        """Why a join of `replica_id` is refused for good now ("" while the job runs)."""
        return self._s.lifecycle.join_refusal(replica_id)

    def silence(self, last_seen: float, now: float) -> str:
        return self._s.silence(last_seen, now)

    # -- replicas ------------------------------------------------------------------------------

    @property
    def replicas(self) -> Mapping[str, Replica]:
        return MappingProxyType(self._s.replica_registry.replicas)

    def live_replicas(self) -> frozenset[str]:
        return self._s.replica_registry.live()

    def dead_replicas(self) -> frozenset[str]:
        return self._s.replica_registry.dead()

    def durable_checkpoint(self) -> bool | None:
        return self._s.replica_registry.durable_checkpoint()

    # -- rounds and quorums --------------------------------------------------------------------

    @property
    def quorum(self) -> Quorum | None:
        return self._s.rounds.quorum

    @property
    def quorum_history(self) -> tuple[Quorum, ...]:
        return tuple(self._s.rounds.quorum_history)

    # -- hosts and orders ----------------------------------------------------------------------

    @property
    def hosts(self) -> Mapping[str, Host]:
        return MappingProxyType(self._s.host_registry.hosts)

    @property
    def rank_holders(self) -> Mapping[tuple[str, int], str]:
        return MappingProxyType(self._s.host_registry.rank_holders)

    def authenticate_agent(self, host_id: str, secret: str) -> Host:
        """The host whose agent proves `secret` (PermissionDenied / NotFound otherwise)."""
        return self._s.host_registry.authenticate_agent(host_id, secret)

    def is_superseded(self, order: OrderOut) -> bool:
        return self._s.host_registry.is_superseded(order)

    def replica_endpoints(self, replica_id: str):
        return self._s.host_registry.replica_endpoints(replica_id)

    def replica_hosts(self, replica_id: str) -> list[Host]:
        return self._s.host_registry.replica_hosts(replica_id)

    def encoded_host_shard(self, shard: int) -> bytes:
        return self._s.host_registry.encoded_host_shard(shard)

    # -- events --------------------------------------------------------------------------------

    @property
    def events(self) -> tuple:
        return tuple(self._s.journal.events)

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


for _name, _path in PASSED_THROUGH.items():
    setattr(ControllerView, _name, property(attrgetter(f"_s.{_path}"), doc=f"the state's {_path}"))
for _name, _path in PASSED_AS_MAPPINGS.items():
    setattr(ControllerView, _name, _as_mapping(f"_s.{_path}"))
del _name, _path

__all__ = ["ControllerView", "PASSED_THROUGH", "PASSED_AS_MAPPINGS"]
