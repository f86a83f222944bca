"""Which orders an agent accepts, and what each does to its assignment: pure decisions.

`plan_order(kind, proposed, current, slots, host_id, version=, current_version=)` answers
with a `Plan`: the assignment the host holds afterwards and its version, the effect on its
trainers, or an error sentence naming the bad value (the agent acks ok=false with it and
changes nothing).

Versions: every order carries the controller's version of this host's assignment when it was
decided; the agent remembers the version of what it runs. An order older than that was
superseded by a later decision (it crossed a failover, or waited in a stream while the host
was cut off) and is refused. A newer ASSIGN replaces whatever the host ran: the controller
moved it. Version 0 means "unversioned" and is never refused for its age.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from agent.policy import Placement, Role, Want
from protos import controller_pb2 as pb


@dataclass(frozen=True)
class Assignment:
    replica_id: str
    ranks: tuple[int, ...]
    world_size: int
    #: where the replica's ranks meet (its rank-0 host), as the controller last said
    rendezvous: str = ""
    coordinator: str = ""

    @classmethod
    def from_proto(cls, msg: pb.Assignment) -> "Assignment | None":
        """None for an empty message (no replica)."""
        if not msg.replica_id and not msg.ranks:
            return None
        return cls(msg.replica_id, tuple(msg.ranks), msg.world_size, msg.rendezvous_address,
                   msg.coordinator_address)

    def same_work(self, other: "Assignment | None") -> bool:
        """The same replica, ranks and world size (where the replica meets aside)."""
        return other is not None and (self.replica_id, self.ranks, self.world_size) == (
            other.replica_id, other.ranks, other.world_size)

    def to_proto(self) -> pb.Assignment:
        return pb.Assignment(replica_id=self.replica_id, ranks=list(self.ranks),
                             world_size=self.world_size)

    def __str__(self) -> str:
        return f"replica {self.replica_id!r} ranks {list(self.ranks)} of {self.world_size}"


class Effect(enum.Enum):
    TRAIN = "train"        # run the (new) assignment's trainers; running ones continue
    RESTART = "restart"    # stop and start every trainer of the assignment
    STOP = "stop"          # stop every trainer (and no standby)
    RELEASE = "release"    # drop the assignment; back to the spare pool (standby if enabled)
    KEEP = "keep"          # nothing changes (the controller confirmed what the host runs)


@dataclass(frozen=True)
class Plan:
    assignment: Assignment | None
    effect: Effect | None
    error: str = ""
    #: the assignment version the host runs afterwards
    version: int = 0


def check_assignment(a: Assignment | None, slots: int) -> str:
    """An error sentence naming the bad value, or "" when the assignment is usable."""
    if a is None or not a.replica_id:
        return "the assignment has no replica_id"
    if a.world_size < 1:
        return f"world_size must be >= 1, got {a.world_size} for replica {a.replica_id!r}"
    if not a.ranks:
        return f"the assignment of replica {a.replica_id!r} has no ranks"
    bad = [r for r in a.ranks if not 0 <= r < a.world_size]
    if bad:
        return f"ranks {bad} of replica {a.replica_id!r} are outside 0..{a.world_size - 1}"
    if len(set(a.ranks)) != len(a.ranks):
        return f"ranks {list(a.ranks)} of replica {a.replica_id!r} repeat"
    if len(a.ranks) > slots:
        return f"{len(a.ranks)} ranks of replica {a.replica_id!r} do not fit in {slots} slots"
    return ""


def plan_order(kind: int, proposed: Assignment | None, current: Assignment | None,
               slots: int, host_id: str, *, version: int = 0, current_version: int = 0) -> Plan:
    """What an order does, or why it is refused (rules in order, first match wins)."""
    plan = _plan(kind, proposed, current, slots, host_id, version, current_version)
    if plan.error:
        return Plan(current, None, plan.error, current_version)
    return Plan(plan.assignment, plan.effect, "", max(version, current_version))


def _plan(kind: int, proposed: Assignment | None, current: Assignment | None, slots: int, host_id: str,
          version: int, current_version: int) -> Plan:
    name = pb.Order.Kind.Name(kind) if kind in pb.Order.Kind.values() else str(kind)
    # A later decision superseded this order: it must not undo what the host runs now.
    if version and version < current_version:
        return Plan(current, None, f"{name} refused: its assignment version {version} is older than "
                                   f"version {current_version}, which host {host_id} runs")
    if kind == pb.Order.CURRENT:
        # The controller's record of this host: adopt it; trainers already running it go on.
        if proposed == current:
            return Plan(current, Effect.KEEP)
        if proposed is None:
            return Plan(None, Effect.RELEASE)
        error = check_assignment(proposed, slots)
        return Plan(current, None, f"CURRENT refused: {error}") if error else Plan(proposed, Effect.TRAIN)
    if kind == pb.Order.ASSIGN:
        error = check_assignment(proposed, slots)
        if error:
            return Plan(current, None, f"ASSIGN refused: {error}")
        # One host runs one assignment: a second, different one is a duplicate assignment,
        # unless a newer decision moved this host (then it replaces the old one).
        if current is not None and current != proposed and not version > current_version:
            return Plan(current, None, f"ASSIGN refused: host {host_id} already runs "
                                       f"{current}; duplicate assignment of {proposed}")
        return Plan(proposed, Effect.TRAIN)
    if kind in (pb.Order.START, pb.Order.RESTART):
        # An empty assignment means "the one you run"; another one is an unknown replica.
        if current is None:
            what = f" of {proposed}" if proposed else ""
            return Plan(None, None, f"{name} refused: host {host_id} has no assignment{what}")
        # Only the replica is compared: a RESTART may carry the replica's other ranks.
        if proposed is not None and proposed.replica_id != current.replica_id:
            return Plan(current, None, f"{name} refused: unknown replica "
                                       f"{proposed.replica_id!r}; host {host_id} runs {current}")
        if proposed is not None and proposed.rendezvous:  # the replica may meet elsewhere now
            current = replace(current, rendezvous=proposed.rendezvous, coordinator=proposed.coordinator)
        return Plan(current, Effect.RESTART if kind == pb.Order.RESTART else Effect.TRAIN)
    if kind == pb.Order.STOP:
        # A bare STOP means "your work moved elsewhere": the host holds nothing afterwards.
        if proposed is None:
            return Plan(None, Effect.STOP)
        if current is None or proposed.replica_id != current.replica_id:
            return Plan(current, None, f"STOP refused: unknown replica {proposed.replica_id!r}; "
                                       f"host {host_id} runs {current or 'nothing'}")
        return Plan(current, Effect.STOP)
    if kind == pb.Order.RELEASE:
        return Plan(None, Effect.RELEASE)
    return Plan(current, None, f"unknown order kind {name}")


def wants_for(assignment: Assignment | None, effect: Effect, slots: int,
              standby: bool, version: int = 0) -> list[Want]:
    """Per-slot wants after an order (generations are the supervisor's business)."""
    assert effect is not Effect.KEEP, "KEEP changes no want"
    if effect is Effect.STOP:
        return [Want(Role.IDLE)] * slots
    if assignment is None:
        return [Want(Role.STANDBY if standby else Role.IDLE)] * slots
    return [Want(Role.TRAIN, 0, placement, version) for placement in placements(assignment)]


def meet_locally(a: Assignment | None, rendezvous_port: int, coordinator_port: int) -> Assignment | None:
    """A replica whose every rank runs on this host meets on loopback, at this host's ports,
    when the controller named no place (its rank-0 host registered no address)."""
    if a is None or a.rendezvous or a.world_size < 2 or len(a.ranks) != a.world_size:
        return a
    return replace(a, rendezvous=f"127.0.0.1:{rendezvous_port}", coordinator=f"127.0.0.1:{coordinator_port}")


def placements(a: Assignment) -> list[Placement]:
    """One per rank the host runs, in slot order."""
    return [Placement(a.replica_id, rank, a.world_size, local, len(a.ranks), a.rendezvous, a.coordinator)
            for local, rank in enumerate(a.ranks)]
