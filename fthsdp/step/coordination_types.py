"""The coordination's vocabulary: its stages, the events it takes and the effects it asks for.

Pure data (fthsdp/step/coordination.py decides; fthsdp/step/coordinator.py does the I/O).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from protos import controller_pb2 as pb
from protos import replica_pb2 as rpb

INF = float("inf")


class ProtocolError(RuntimeError):
    """An event the coordinator cannot take in its state (a bug in the caller)."""


class Stage(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    QUORUM = "quorum"
    VOTING = "voting"
    DIGESTS = "digests"
    FINISHING = "finishing"
    REPORTING = "reporting"
    FINISHED = "finished"
    FAILED = "failed"


class QuorumRefusal(enum.Enum):
    RETRY = rpb.NoPlan.RETRY
    FINISHED = rpb.NoPlan.FINISHED
    FATAL = rpb.NoPlan.FATAL


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class FromRank:
    """A decoded frame from connection `conn`: kind is the RankFrame's oneof name."""
    conn: int
    kind: str
    message: object


@dataclass(frozen=True)
class ConnectionLost:
    conn: int
    reason: str


@dataclass(frozen=True)
class QuorumAnswered:
    answer: pb.QuorumResponse


@dataclass(frozen=True)
class QuorumFailed:
    kind: QuorumRefusal
    reason: str


@dataclass(frozen=True)
class FinishReported:
    detail: str = ""


@dataclass(frozen=True)
class CheckpointSaved:
    """Rank 0 wrote the durable checkpoint of the state after committing `step`."""
    step: int


@dataclass(frozen=True)
class Tick:
    pass


Event = Union[FromRank, ConnectionLost, QuorumAnswered, QuorumFailed, FinishReported, CheckpointSaved, Tick]

# ---------------------------------------------------------------- effects


@dataclass(frozen=True)
class Broadcast:
    """Send this frame to every rank (encoded once)."""
    frame: rpb.CoordinatorFrame


@dataclass(frozen=True)
class SendTo:
    conn: int
    frame: rpb.CoordinatorFrame


@dataclass(frozen=True)
class SendEach:
    """Send each connection its own frame (a plan with that rank's address column)."""
    frames: tuple[tuple[int, rpb.CoordinatorFrame], ...]


@dataclass(frozen=True)
class Refuse:
    """Tell `conn` why, then close it."""
    conn: int
    reason: str


@dataclass(frozen=True)
class RequestQuorum:
    step: int
    known_quorum_id: int
    ftar_addresses: tuple[str, ...]
    state_addresses: tuple[str, ...]


@dataclass(frozen=True)
class ReportStep:
    quorum_id: int
    step: int
    step_time_s: float
    loss: float
    tokens: int
    digest: str
    caught_up: bool
    note: str = ""
    #: with a digest: each rank's, shortened (rank k of every replica holds the same shard, so
    #: the controller names the host of a rank whose digest differs: silent data corruption)
    rank_digests: tuple[str, ...] = ()
    checkpoint_step: int | None = None  # the newest durable checkpoint (committed step), when any


@dataclass(frozen=True)
class ReportFailure:
    quorum_id: int
    step: int
    reason: str
    dead: bool


@dataclass(frozen=True)
class ReportFinished:
    step: int           # the last committed step (-1: none)
    reason: str


Effect = Union[Broadcast, SendTo, SendEach, Refuse, RequestQuorum, ReportStep, ReportFailure, ReportFinished]
