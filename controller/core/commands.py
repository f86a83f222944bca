"""What can happen to the controller: one frozen value per kind, the input of `ControllerCore.step`.

Callers' requests (already decoded and authenticated by the service), the shell's own news
(a connection lost, a write that failed, the ticker) and an operator's REST actions. Each
names only what the core needs; the time comes with the step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from controller.core.diagnosis.telemetry import HostReport
from controller.core.model import Assignment, JoinRequest, OrderOut


def arguments(command, *skip: str) -> dict:
    """A command's fields as keyword arguments (without `skip`)."""
    return {f.name: getattr(command, f.name) for f in fields(command) if f.name not in skip}


# -- a replica coordinator's calls -----------------------------------------------------------

@dataclass(frozen=True)
class Join:
    """A replica's coordinator enters this round (its answer comes when the round closes)."""
    request: JoinRequest


@dataclass(frozen=True)
class LeaveRound:
    """A coordinator's join ended without its answer (it hung up)."""
    replica_id: str
    why: str


@dataclass(frozen=True)
class ConnectionLost:
    """A coordinator's connection closed without goodbye: its replica becomes suspect."""
    replica_id: str
    how: str


@dataclass(frozen=True)
class ReportStep:
    """A coordinator's commit report."""
    replica_id: str
    step: int
    quorum_id: int
    loss: float | None = None
    step_time_s: float | None = None
    tokens: int = 0
    host_id: str = ""
    digest: str = ""
    caught_up: bool = False
    checkpoint_step: int | None = None
    rank_digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReportCommitFailed:
    replica_id: str
    step: int
    reason: str
    quorum_id: int
    host_id: str = ""


@dataclass(frozen=True)
class ReportReplicaDead:
    replica_id: str
    reason: str
    host_id: str = ""


@dataclass(frozen=True)
class ReportFinished:
    """A replica trained to its end; the answer is the job's state."""
    replica_id: str
    step: int
    reason: str = ""
    host_id: str = ""


@dataclass(frozen=True)
class Heartbeat:
    """Hosts and replicas alive; the answer is the ids unknown or dead (they must register or join).
    `finishing_trainers`: how many trainers of `host_ids` still run after the job COMPLETED."""
    host_ids: tuple[str, ...] = ()
    replica_ids: tuple[str, ...] = ()
    finishing_trainers: int = 0


# -- an agent's calls ----------------------------------------------------------------------

@dataclass(frozen=True)
class RegisterAgent:
    """The answer is (assignment, reason)."""
    host_id: str
    incarnation: str
    spare: bool = False
    slots: int = 1
    labels: dict[str, str] | None = None
    assignment: Assignment | None = None
    secret_hash: str = ""
    address: str = ""
    rendezvous_port: int = 0
    coordinator_port: int = 0
    previous_secret: str = ""
    standby: bool = False


@dataclass(frozen=True)
class DeregisterAgent:
    host_id: str
    incarnation: str
    reason: str


@dataclass(frozen=True)
class ConnectOrders:
    """A host opened its order stream; the answer is the orders it is sent first. `pending`
    is its newest order not delivered while it had no stream."""
    host_id: str
    pending: OrderOut | None = None


@dataclass(frozen=True)
class AckOrder:
    host_id: str
    order_id: str
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class TrainerExit:
    host_id: str
    replica_id: str
    rank: int
    exit_code: int = 0
    signal: int = 0
    stderr_tail: str = ""
    gave_up: bool = False
    version: int = 0


@dataclass(frozen=True)
class Telemetry:
    """An agent's summary; the answer is what was left out and why."""
    report: HostReport
    agent_secret: str


# -- an operator's actions (REST, admin) ----------------------------------------------------

@dataclass(frozen=True)
class Drain:
    host_id: str


@dataclass(frozen=True)
class Cordon:
    host_id: str
    reason: str = ""


@dataclass(frozen=True)
class Uncordon:
    host_id: str


# -- the shell's own news -------------------------------------------------------------------

@dataclass(frozen=True)
class CloseRound:
    """Look at the open round: it closes when due (Ready.quorum)."""


@dataclass(frozen=True)
class Tick:
    """Time passed: silence expires, digests are compared, the diagnosis runs, the round is
    looked at; what is written behind is due."""


@dataclass(frozen=True)
class Takeover:
    """This controller leads from now on (`candidate`): clients of a running job get
    `grace_s` to find it before silence counts."""
    candidate: str
    grace_s: float


@dataclass(frozen=True)
class WriteFailed:
    """The store did not take these sections: they are written again at the next chance, and
    the orders that waited for them go out after that write."""
    sections: tuple[str, ...] = ()
    orders: tuple[OrderOut, ...] = ()


__all__ = [
    "AckOrder", "CloseRound", "ConnectOrders", "ConnectionLost", "Cordon", "DeregisterAgent", "Drain", "Heartbeat",
    "Join", "LeaveRound", "RegisterAgent", "ReportCommitFailed", "ReportFinished", "ReportReplicaDead", "ReportStep",
    "Takeover", "Telemetry", "Tick", "TrainerExit", "Uncordon", "WriteFailed", "arguments",
]
