"""One rank's state in the replica step protocol: its phases and the frozen RankState.

fthsdp/step/protocol.py holds the transitions (`advance` and its tables) and draws the phases;
this module only names them, so the state's fields are read in one place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fthsdp.data_ledger import DataLedger
from fthsdp.settings import RuntimeSettings
from fthsdp.step.plan import RankPlan

INF = float("inf")


class ProtocolError(RuntimeError):
    """A local event in a state that does not allow it (a bug in the caller)."""


class Phase(enum.Enum):
    IDLE = "idle"              # between steps: the state is the committed state at `step`
    PLANNING = "planning"      # begin sent; waiting for the coordinator's plan
    INNER = "inner"            # semi-synchronous: an inner step on the replica's own group
    TRAINING = "training"      # plan in hand: reducing gradients (behind: fetching meanwhile)
    SYNCING = "syncing"        # semi-synchronous: plan in hand, reducing the pseudo-gradient
    VOTING = "voting"          # vote sent; waiting for the decision
    RESUMING = "resuming"      # loading the durable checkpoint a rollback quorum offered
    ENDED = "ended"            # no more steps (max_steps, a rank closed, job COMPLETED)
    FINISHING = "finishing"    # close sent; waiting for the coordinator's last word
    FINISHED = "finished"
    FAILED = "failed"          # fatal: raised to the training script


class Fetch(enum.Enum):
    NONE = "none"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Flight(enum.Enum):
    """A sync in flight while the trainer trains its last inner steps (between them the phase is IDLE):
    streaming_diloco's overlap (tau), or a blocking sync's plan asked for ahead (P)."""
    NONE = "none"
    PLANNING = "planning"      # begin sent at inner = K - tau (or K - P); waiting for the plan
    PLANNED = "planned"        # (plan ahead, no overlap) the plan is in and held: the reduce starts at the due step
    REDUCING = "reducing"      # the reduce runs in the background
    VOTING = "voting"          # vote sent; waiting for the decision
    COMMITTED = "committed"    # committed: applied at the due step (inner = K)


_HELD = (Fetch.RUNNING, Fetch.DONE)  # a fetch thread or its staged result: CancelFetch drops either


@dataclass(frozen=True)
class RankState:
    settings: RuntimeSettings           # rank, replica, bounds (fixed for the process's life)
    phase: Phase
    step: int                           # the committed state this rank holds is the state at its start
    ledger: DataLedger
    attempt: int = 0                    # the newest attempt number seen from the coordinator
    plan: RankPlan | None = None
    quorum_id: int = 0
    deadline: float = INF               # PLANNING, VOTING, FINISHING
    reduced: bool = False
    failure: str = ""                   # the first local failure of this attempt: the vote is no
    fetch: Fetch = Fetch.NONE
    fetch_deadline: float = INF
    ending: bool = False                # End arrived while the fetch still ran
    loss: float = 0.0
    tokens: int = 0
    ledger_before: DataLedger | None = None
    fetched_ledger: DataLedger | None = None  # the source's ledger, taken at commit
    torn: bool = False                  # a fetch wrote into the live state and no commit adopted one since
    failures_in_a_row: int = 0
    last_failure: str = ""
    reason: str = ""                    # why ENDED, FINISHED or FAILED
    resume_to: int = -1                 # RESUMING: the step the checkpoint being loaded starts
    inner: int = 0                      # semi-synchronous: inner steps trained since the last sync
    flight: Flight = Flight.NONE        # streaming_diloco with an overlap: the sync in flight
    background: bool = False            # this attempt's reduce was started in flight (GatherReduced at commit)
    deferred: bool = False              # this attempt's no vote defers a catch-up: its retry is not counted
    tokens_voted: int = 0               # tokens already reported with a vote (the overlap's go with the next)


def initial_state(settings: RuntimeSettings, step: int = 0, ledger: DataLedger | None = None) -> RankState:
    return RankState(settings, Phase.IDLE, step, ledger or DataLedger())
