"""Records the controller keeps: replicas, hosts, quorums, events -- and their lifecycles.

Each lifecycle is drawn once, in its state enum's docstring below (`ReplicaState`,
`HostState`, `JobState`), beside the transition table the code that changes the state
checks (`REPLICA_MOVES`, `HOST_MOVES`, `JOB_MOVES`, through `check_move`): a move that is
not in its table is a bug and raises `IllegalMove` before anything changes.
tests/controller/test_lifecycles.py reads every drawing and checks it against its table.
A drawing's edge lines read `FROM / FROM ──(why)──▶ TO / TO`.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field


class ReplicaState(str, enum.Enum):
    """A replica's lifecycle (controller.core.replicas.ReplicaRegistry.transition moves it;
    every move carries a reason and becomes an event). A record is born JOINING, at its
    first join.

    JOINING / HEALTHY / BEHIND / DIVERGED ──(seated in a quorum at max_step)──▶ HEALTHY
    JOINING / HEALTHY / BEHIND ──(seated below max_step: catches up from a peer)──▶ BEHIND
    BEHIND ──(caught up: committed the quorum's max_step)──▶ HEALTHY
    HEALTHY / BEHIND ──(left out of a quorum)──▶ JOINING
    JOINING / HEALTHY / BEHIND / DIVERGED ──(its digest in the minority; seated to re-sync)──▶ DIVERGED
    DIVERGED ──(re-synced: a caught-up commit that matches the reference)──▶ HEALTHY
    JOINING / HEALTHY / BEHIND / DIVERGED ──(killed: silence, a report, a death, a restart)──▶ DEAD
    JOINING / HEALTHY / BEHIND / DIVERGED / DEAD ──(its coordinator says it finished)──▶ FINISHED
    DEAD / FINISHED ──(joins again; FINISHED only as a new incarnation)──▶ JOINING
    DEAD / FINISHED ──(a late caught-up commit of one that must re-sync)──▶ HEALTHY / DIVERGED

    Killed: heartbeat silence, a failure report, a trainer's death, its host's death, or its
    coordinator restarted (a new incarnation) while it was live (DeathCause below). A
    DIVERGED replica stays a member of rounds (controller.core.divergence); it leaves that
    state only by re-syncing, dying or finishing, and `must_resync` keeps it re-syncing
    through a restart. A DEAD or FINISHED replica (SETTLED) is not waited for in rounds; a
    FINISHED one is not declared dead by silence nor killed by its trainers' exits. The last
    row is what the code does with a caught-up commit report that arrives after its replica
    was declared DEAD (or FINISHED): a re-sync heals the record without a join. Whether the
    job is COMPLETED or FAILED is JobState's.
    """

    JOINING = "JOINING"
    HEALTHY = "HEALTHY"
    BEHIND = "BEHIND"
    DEAD = "DEAD"
    DIVERGED = "DIVERGED"
    FINISHED = "FINISHED"


#: What a job without a durable checkpoint risks (the log, the status API and page say it).
NO_CHECKPOINT = "a failure of every replica restarts from step 0"

#: Replica states whose work is over until a new incarnation: rounds do not wait for them.
SETTLED = (ReplicaState.DEAD, ReplicaState.FINISHED)


class JobState(str, enum.Enum):
    """The job's lifecycle (controller.core.finishing.JobLifecycle moves it; the rules are
    there and in controller.core.job_failure). Both endings are final and durable, each
    with its reason.

    RUNNING ──(every replica FINISHED or DEAD, at least one FINISHED)──▶ COMPLETED
    RUNNING ──(no replica can progress for fail_after_s; a crash loop at once)──▶ FAILED

    FAILING is not a state: it is how REST and the status page show a RUNNING job while no
    replica can make progress (`failing_since`), with the time left before it FAILS.
    """

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class HostState(str, enum.Enum):
    """A host's lifecycle (controller.core.hosts.HostRegistry moves it, through `move_host`).
    A record is born SPARE, at its agent's first registration, and takes its work at once.

    SPARE ──(given work: its registration claims it, or a failed host's)──▶ ACTIVE
    ACTIVE ──(its work moved to a spare while its agent lives)──▶ SPARE
    ACTIVE / SPARE ──(agent silent past the heartbeat timeout, or it deregisters)──▶ DEAD
    DEAD ──(its agent registers again: with its work, or into the pool)──▶ ACTIVE / SPARE

    A cordon is not a state: it is a flag with a reason and who set it ("admin",
    "diagnosis" or "failure": drain, evict, a trainer crash loop past the restart budget, a
    death). The status API shows CORDONED for a live cordoned host that runs nothing or
    whose work waits for a spare (controller/service/views.py host_view).
    """

    ACTIVE = "ACTIVE"
    SPARE = "SPARE"
    DEAD = "DEAD"


_LIVE = (ReplicaState.JOINING, ReplicaState.HEALTHY, ReplicaState.BEHIND, ReplicaState.DIVERGED)


def _moves(*rows) -> frozenset:
    return frozenset((a, b) for sources, targets in rows for a in sources for b in targets if a != b)


R, H, J = ReplicaState, HostState, JobState
#: The replica moves the code makes: (from, to); ReplicaState's docstring draws them.
REPLICA_MOVES = _moves(
    (_LIVE, (R.HEALTHY, R.DIVERGED, R.DEAD)),
    ((R.JOINING, R.HEALTHY, R.BEHIND), (R.BEHIND,)),
    ((R.HEALTHY, R.BEHIND), (R.JOINING,)),
    (_LIVE + (R.DEAD,), (R.FINISHED,)),
    ((R.DEAD, R.FINISHED), (R.JOINING, R.HEALTHY, R.DIVERGED)),
)
#: The host moves: HostState's docstring draws them.
HOST_MOVES = _moves(((H.SPARE,), (H.ACTIVE, H.DEAD)), ((H.ACTIVE,), (H.SPARE, H.DEAD)),
                    ((H.DEAD,), (H.ACTIVE, H.SPARE)))
#: The job moves: JobState's docstring draws them.
JOB_MOVES = _moves(((J.RUNNING,), (J.COMPLETED, J.FAILED)))
del R, H, J


class IllegalMove(RuntimeError):
    """A state change its lifecycle's table does not allow: a bug in the caller (raised
    before anything changed)."""


def check_move(table: frozenset, what: str, old: enum.Enum, new: enum.Enum) -> None:
    """Raise IllegalMove unless `what` may move from `old` to `new` (staying is no move)."""
    if old != new and (old, new) not in table:
        raise IllegalMove(f"{what} may not move from {old.value} to {new.value}")


def move_host(h: Host, state: HostState) -> None:
    """The one way a host record changes state (HOST_MOVES checked)."""
    check_move(HOST_MOVES, f"host {h.host_id}", h.state, state)
    h.state = state


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
    #: How often its runtime writes a durable checkpoint, as its latest join said (every N-th
    #: committed step; 0: never).
    checkpoint_every_steps: int = 0


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
    #: When its trainers' deaths restarted its replica, those inside restart_window_s (at most
    #: restart_budget of them; controller.core.restarts): durable, so a new leader counts on.
    restart_times_s: list[float] = field(default_factory=list)
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
    #: how often the replica writes a durable checkpoint (every N-th committed step; 0: never)
    checkpoint_every_steps: int = 0


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
