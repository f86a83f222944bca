"""Records the controller keeps: replicas, hosts, quorums, events.

Replica states (every transition carries a reason and becomes an event):

    JOINING ──(in a quorum, at max_step)──▶ HEALTHY
    JOINING ──(in a quorum, below max_step)─▶ BEHIND
    HEALTHY ◀──────(caught up, commits)───── BEHIND
    HEALTHY / BEHIND ──(late for a round)──▶ JOINING
    any ──(heartbeat silence, failure report, trainer exit, host death)──▶ DEAD
    DEAD ──(joins again, usually a new incarnation)──▶ JOINING
    HEALTHY / BEHIND ──(its digest is in the minority for a step)──▶ DIVERGED
    DIVERGED ──(in a quorum: not healthy, re-syncs from the reference; commits caught up)──▶ HEALTHY
    any ──(its coordinator reports it finished)──▶ FINISHED
    FINISHED ──(a new incarnation joins while the job runs)──▶ JOINING

A DIVERGED replica is still a member of rounds; it leaves that state only by re-syncing (or
dying). A FINISHED replica is not waited for in rounds, not declared dead by silence, and not
killed by its trainers' exits: only a new incarnation takes it back. The job is COMPLETED once
every registered replica is FINISHED or DEAD and at least one finished; that is final.

Host states: ACTIVE (runs an assignment), SPARE (in the pool), DEAD (agent silent);
`cordon` is a separate flag with a reason (an admin action or a failure).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field


class ReplicaState(str, enum.Enum):
    JOINING = "JOINING"
    HEALTHY = "HEALTHY"
    BEHIND = "BEHIND"
    DEAD = "DEAD"
    DIVERGED = "DIVERGED"
    FINISHED = "FINISHED"


#: Replica states whose work is over until a new incarnation: rounds do not wait for them.
SETTLED = (ReplicaState.DEAD, ReplicaState.FINISHED)


class JobState(str, enum.Enum):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class HostState(str, enum.Enum):
    ACTIVE = "ACTIVE"
    SPARE = "SPARE"
    DEAD = "DEAD"


class DeathCause(str, enum.Enum):
    HEARTBEAT = "heartbeat"
    REPORTED = "reported"
    TRAINER_EXIT = "trainer_exit"
    HOST = "host"
    RESTARTED = "restarted"


@dataclass
class Replica:
    replica_id: str
    state: ReplicaState = ReplicaState.JOINING
    reason: str = "registered"
    incarnation: str = ""
    #: The step this replica trains next (last committed + 1).
    step: int = 0
    #: Highest step committed (-1: none yet).
    committed_step: int = -1
    world_size: int = 0
    ftar_addresses: tuple[str, ...] = ()
    state_addresses: tuple[str, ...] = ()
    #: Where the replica's coordinator (its rank 0) listens, as its join said (the wire calls
    #: it `leader_address`).
    coordinator_address: str = ""
    last_seen: float = 0.0
    #: Set by a COMMIT_FAILED report; the next quorum gets a new id.
    failed_commit: bool = False
    last_loss: float | None = None
    last_step_time_s: float | None = None
    tokens: int = 0
    #: The last digest of its committed state it reported, and the step it was taken after.
    digest: str = ""
    digest_step: int = -1
    #: Its digest diverged and it has not re-synced since: it stays marked through a restart
    #: with a new incarnation (and a failover), so it re-syncs before it counts as healthy.
    must_resync: bool = False
    #: The history (see controller.core.rollback) this replica last trained on as a quorum
    #: member: its commits extend the job's history only while this is the current one.
    history_epoch: int = 0
    #: The quorum id and step of the last quorum answer this replica was given: a commit
    #: report must name exactly these (0 / -1: no answer yet). A fast-path answer (same quorum
    #: id, the step after the committed one) is not written down before it goes out, since
    #: it follows from what is durable; see ReplicaRegistry.check_given.
    given_quorum_id: int = 0
    given_step: int = -1
    #: Loaded from a snapshot (not durable itself): the answer given since may be a fast-path
    #: one that the snapshot does not hold.
    given_restored: bool = False
    #: How often the controller restarted this replica's ranks together on its hosts.
    restarts: int = 0


@dataclass(frozen=True)
class Assignment:
    replica_id: str
    ranks: tuple[int, ...]
    world_size: int

    def describe(self) -> str:
        return f"replica {self.replica_id} ranks {','.join(map(str, self.ranks))}"


@dataclass
class Host:
    host_id: str
    incarnation: str
    state: HostState
    slots: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    assignment: Assignment | None = None
    last_seen: float = 0.0
    cordoned: bool = False
    cordon_reason: str = ""
    #: "admin" cordons survive re-registration; "failure" cordons are lifted by it.
    cordon_by: str = ""
    #: The decision that last gave this host its assignment or took it away: one counter over
    #: all hosts, persisted, so it only grows, across failovers too. Orders carry it; an agent
    #: refuses an order older than what it runs.
    assignment_version: int = 0
    #: SHA-256 (hex) of the secret handed to the agent at registration; its order stream, acks
    #: and exit reports must present the secret. Never shown.
    secret_hash: str = ""
    #: Where other hosts reach this host's trainers (its pod IP; "" when it registered none),
    #: and the ports where a replica's rank 0 listens here: the torch.distributed rendezvous
    #: (MASTER_PORT) and the replica's coordinator.
    address: str = ""
    rendezvous_port: int = 0
    coordinator_port: int = 0
    #: Its agent pre-starts standby trainers while the host has no assignment (shown, not acted on).
    standby: bool = False
    #: How many of its trainers still run after the job COMPLETED, finishing their own work after
    #: Manager.close() (its agent's heartbeats say; shown, not persisted).
    finishing_trainers: int = 0


def host_can_run(h: Host) -> bool:
    """Not DEAD, and not cordoned after a failure (a host that waits to be replaced)."""
    return h.state != HostState.DEAD and not (h.cordoned and h.cordon_by == "failure")


@dataclass(frozen=True)
class Member:
    replica_id: str
    step: int
    healthy: bool


@dataclass(frozen=True)
class Quorum:
    quorum_id: int
    members: tuple[Member, ...]
    max_step: int
    #: behind replica -> sources by rank shard
    recover: dict[str, tuple[str, ...]]
    lr_scale: float
    reason: str
    formed_at: float
    #: Set on a rollback quorum whose members should load the newest durable checkpoint
    #: (the state after committing this step) rather than train on from their own.
    resume_checkpoint_step: int | None = None

    @functools.cached_property
    def member_ids(self) -> frozenset[str]:
        return frozenset(m.replica_id for m in self.members)


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    subject: str
    message: str
    cause: str = ""
    #: "info", "warning" or "error" (controller/core/events.py)
    level: str = "info"
    #: counts up over the job's life, across failovers
    seq: int = 0


@dataclass(frozen=True)
class OrderOut:
    """An order the service must deliver to one agent."""

    host_id: str
    order_id: str
    kind: str
    assignment: Assignment | None
    reason: str
    #: The recipient's assignment version when this was decided (Host.assignment_version).
    version: int = 0
    #: The newest assignment version among the hosts of the assignment's replica.
    replica_version: int = 0
    #: Where the assignment's replica meets: its rank-0 host's rendezvous (MASTER_ADDR:
    #: MASTER_PORT) and coordinator addresses, when that host registered an address.
    rendezvous_address: str = ""
    coordinator_address: str = ""


@dataclass(frozen=True)
class JoinRequest:
    """A replica coordinator's join of a round (the wire's QuorumRequest, decoded)."""

    replica_id: str
    step: int
    world_size: int
    incarnation: str = ""
    ftar_addresses: tuple[str, ...] = ()
    state_addresses: tuple[str, ...] = ()
    #: the replica's coordinator's address (the wire's `leader_address`)
    coordinator_address: str = ""
    host_id: str = ""


def refresh_seen(records: dict, ids, dead, now: float) -> list[str]:
    """Heartbeats: refresh `last_seen` of each live record named (hosts or replicas, `dead`
    their DEAD state); return the ids that are unknown or dead (their senders must register or
    join again)."""
    unknown = []
    for key in ids:
        record = records.get(key)
        if record is None or record.state == dead:
            unknown.append(key)
        else:
            record.last_seen = now
    return unknown
