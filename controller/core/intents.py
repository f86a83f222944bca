"""Intents: what a component asks of the rest of the controller, as values. Pure.

A component (lifecycle, divergence, restarts, ...) owns its data and changes only that; what
its decision asks of the others comes back as a list of intents, which `ControllerState.act`
carries out in one place, in order (so events keep the order they were decided in).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.digests import Verdict
from controller.core.model import DeathCause, ReplicaState


@dataclass(frozen=True)
class Announce:
    """An event for the journal and the event log."""

    kind: str
    subject: str
    message: str
    cause: str = ""
    level: str | None = None


@dataclass(frozen=True)
class Persist:
    """A store section changed (controller.core.pending_writes): `urgent`, before the answer."""

    section: str
    urgent: bool = True


@dataclass(frozen=True)
class EndRounds:
    """The job ended: no round closes from now on, for `reason`."""

    reason: str


@dataclass(frozen=True)
class KillReplica:
    replica_id: str
    cause: DeathCause
    reason: str


@dataclass(frozen=True)
class MoveReplica:
    """A replica's state changes (its record says why); `unless_settled`: not if it is DEAD
    or FINISHED by the time this is carried out."""

    replica_id: str
    state: ReplicaState
    reason: str
    unless_settled: bool = False


@dataclass(frozen=True)
class Diagnose:
    """Digest verdicts for the diagnosis (SDC findings: which hosts hold the differing state)."""

    verdicts: tuple[Verdict, ...]


@dataclass(frozen=True)
class RestartReplica:
    """Restart every rank of the replica together, on its hosts (after a trainer's death)."""

    replica_id: str
    why: str


@dataclass(frozen=True)
class ReplaceHost:
    """Cordon the host after a failure and move its work to a spare."""

    host_id: str
    reason: str


@dataclass(frozen=True)
class MoveWork:
    """Move the failed, departed or evicted host's assignment to a spare (its replica restarts
    around it), or, without a spare, stop the replica's other hosts."""

    host_id: str


@dataclass(frozen=True)
class Evict:
    """Move the host's work to a spare and cordon it ("diagnosis"); if that fails, an event
    names `finding` and the error (with `cause`)."""

    host_id: str
    reason: str
    finding: str
    cause: str


Intent = (MoveWork | Evict | Announce | Persist | EndRounds | KillReplica | MoveReplica | Diagnose | RestartReplica
          | ReplaceHost)
