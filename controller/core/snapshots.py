"""The store sections, as ControllerState holds them now (controller.core.pending_writes names
them). Pure: these read the state and build each section's value; `ControllerState.restore`
reads them back.
"""

from __future__ import annotations

from dataclasses import fields

from controller.core.host_records import host_record
from controller.core.model import Replica
from controller.core.pending_writes import JOURNAL, REPLICAS
from controller.core.quorum_codec import quorum_to_dict
from controller.core.sizes import digest_ledger_budget

SNAPSHOT_VERSION = 1
#: What of a replica survives a failover (addresses are kept apart; last_seen restarts).
REPLICA_DURABLE_FIELDS = tuple(
    f.name for f in fields(Replica) if f.name not in ("last_seen", "ftar_addresses", "state_addresses", "given_restored")
)


def section(state, which: str) -> dict | bytes:
    """What the store section `which` (controller.core.pending_writes) holds now."""
    kind, _, name = which.partition("/")
    if kind == REPLICAS:
        return replicas_section(state)
    if kind == JOURNAL:
        return journal_section(state)
    if kind == "addresses":
        return addresses_section(state, name)
    if kind == "hosts":
        return state.host_registry.encoded_host_shard(int(name))
    raise ValueError(f"unknown store section {which!r}")


def replicas_section(state) -> dict:
    """Written before answering: small, and on the hot path of every committed step."""
    rounds = state.rounds
    return {
        "version": SNAPSHOT_VERSION,
        "quorum": quorum_to_dict(state.quorum) if state.quorum else None,
        "replicas": [
            {k: getattr(r, k) for k in REPLICA_DURABLE_FIELDS} for r in state.replicas.values()
        ],
        "first_quorum_id": state.rounds.first_quorum_id,
        "max_committed_step": state.rounds.max_committed_step,
        "steps_committed": state.rounds.steps_committed,
        "swaps": state.host_registry.swaps,
        "deaths": state.replica_registry.deaths,
        "order_seq": state.outbox.order_seq,
        "digest_mismatches": state.divergence.mismatches,
        "completed_at": state.lifecycle.completed_at,
        "failed_at": state.lifecycle.failed_at,
        "job_end_reason": state.lifecycle.job_end_reason,
        "history": [rounds.history_step, rounds.history_epoch, rounds.branch_start_step, rounds.newest_checkpoint_step],
        "steps_lost": state.rounds.steps_lost,
        "history_changes": state.rounds.history_changes,
        "version_ceiling": state.host_registry.version_ceiling,
        "replica_versions": state.host_registry.replica_versions,
        "goodput": state.goodput.snapshot(),
        "digests": state.divergence.snapshot(digest_ledger_budget(state.settings)),
    }


def journal_section(state) -> dict:
    """Recent quorums and events, for the status API: written behind, within a tick."""
    return {
        "version": SNAPSHOT_VERSION,
        "history": [quorum_to_dict(q) for q in state.rounds.quorum_history],
        "events": [[e.at, e.kind, e.subject, e.message, e.cause, e.level, e.seq] for e in state.journal.events],
        "event_seq": state.journal.event_seq,
        "goodput": state.goodput.snapshot_history(),
    }


def addresses_section(state, replica_id: str) -> dict:
    r = state.replicas[replica_id]
    return addresses_snapshot(r.ftar_addresses, r.state_addresses)


def addresses_snapshot(ftar, state) -> dict:
    """A replica's addresses section, as it would be written."""
    return {"version": SNAPSHOT_VERSION, "ftar": list(ftar), "state": list(state)}


def host_section(state, shard: int) -> dict:
    return host_sections(state, [shard])[shard]


def host_sections(state, shards) -> dict[int, dict]:
    """Several shards in one pass over the hosts."""
    hosts = state.host_registry
    return {i: {"version": SNAPSHOT_VERSION,
                "hosts": [host_record(hosts.hosts[h]) for h in hosts.shards.members.get(i, ())]}
            for i in shards}
