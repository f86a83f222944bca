"""The rank step protocol's vocabulary: the events it takes and the effects it returns.

Events are what happened (the training script called, the coordinator said, the catch-up
fetch finished, time passed); effects are what the Manager must do, in order. Both are
plain frozen values; fthsdp/step/protocol.py holds the states and the transitions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from fthsdp.data_ledger import DataLedger
from fthsdp.step.plan import RankPlan


class Refusal(enum.Enum):
    RETRY = "retry"
    FINISHED = "finished"
    FATAL = "fatal"


@dataclass(frozen=True)
class StepOutcome:
    """How one step attempt ended (for logs, metrics and tests)."""
    committed: bool
    step: int                           # the step trained (the plan's step)
    quorum_id: int
    attempt: int
    behind: bool
    included: tuple[str, ...]
    positions_before: dict[str, int]    # the ledger the step's batches were read from
    reason: str
    lr_scale: float = 1.0


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class Begin:
    """The training script starts a step."""


@dataclass(frozen=True)
class PlanArrived:
    attempt: int
    step: int                           # the step of the begin this answers
    plan: RankPlan | None               # None when it could not be derived
    error: str = ""


@dataclass(frozen=True)
class ResumeOrdered:
    """The coordinator's answer to a begin on a rollback quorum: every rank loads the durable
    checkpoint of the state after committing `checkpoint_step` instead of training."""
    attempt: int
    step: int                           # the step of the begin this answers
    quorum_id: int
    checkpoint_step: int


@dataclass(frozen=True)
class CheckpointLoaded:
    """The checkpoint LoadCheckpoint asked for is in place (ledger set), or could not be loaded."""
    step: int                           # the step the loaded state starts (-1: nothing loaded)
    ledger: DataLedger | None = None
    reason: str = ""


@dataclass(frozen=True)
class PlanRefused:
    attempt: int
    kind: Refusal
    reason: str
    step: int = -1                      # the step of the begin this answers (-1: not said)


@dataclass(frozen=True)
class Reduced:
    """A gradient reduction (all of them, or one DDP bucket) finished."""
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class FetchFinished:
    ok: bool
    reason: str = ""
    ledger: DataLedger | None = None    # the fetched ledger when ok


@dataclass(frozen=True)
class End:
    """The training script ends the step (after backward): vote."""
    loss: float = 0.0
    tokens: int = 0


@dataclass(frozen=True)
class DecisionArrived:
    attempt: int
    commit: bool
    reason: str


@dataclass(frozen=True)
class Tick:
    """Time passed (deadlines are checked against `now`)."""


@dataclass(frozen=True)
class CoordinatorLost:
    reason: str


@dataclass(frozen=True)
class Close:
    reason: str = "the training script closed its Manager"


@dataclass(frozen=True)
class FinishedArrived:
    clean: bool
    reason: str


Event = Union[Begin, PlanArrived, ResumeOrdered, CheckpointLoaded, PlanRefused, Reduced, FetchFinished, End,
              DecisionArrived, Tick, CoordinatorLost, Close, FinishedArrived]
# What the coordinator sends may come late, twice, or not fit: never an error.
FROM_COORDINATOR = (PlanArrived, ResumeOrdered, PlanRefused, DecisionArrived, FinishedArrived, CoordinatorLost)


# ---------------------------------------------------------------- effects


@dataclass(frozen=True)
class SendBegin:
    step: int


@dataclass(frozen=True)
class ServeState:
    """Serve this rank's state at the start of `step` to fetchers: the plan's (`fetchers`), or,
    before the plan came (None), any authenticated one."""
    step: int
    fetchers: tuple[str, ...] | None = None


@dataclass(frozen=True)
class StopServing:
    """Wait (at most timeout_s) until these fetchers acknowledged their copy, then stop serving."""
    wait_for: tuple[str, ...] = ()
    timeout_s: float = 0.0


@dataclass(frozen=True)
class ConfigureRing:
    """(Re)build the FTAR ring for the plan; `serving`: this rank serves the plan's fetchers, so
    its state is snapshotted at the step boundary first (never in flight: it serves nobody)."""
    plan: RankPlan
    serving: bool = True


@dataclass(frozen=True)
class StartFetch:
    plan: RankPlan


@dataclass(frozen=True)
class CancelFetch:
    """Stop the fetch, and drop what it staged."""
    reason: str


@dataclass(frozen=True)
class AdoptFetched:
    """At commit, before ApplyStep: load the fetched optimizer and registered state (the model
    tensors are in place already): it is the source's state at the start of `step`."""
    step: int


@dataclass(frozen=True)
class LoadCheckpoint:
    """Load the durable checkpoint of the state at the start of `step` (model, optimizer,
    registered state, ledger), then feed CheckpointLoaded."""
    step: int


@dataclass(frozen=True)
class SendVote:
    attempt: int
    ok: bool
    reason: str
    loss: float
    tokens: int


@dataclass(frozen=True)
class ApplyStep:
    """Commit: the optimizer step (learning rate × plan.lr_scale); registered state moves on."""
    plan: RankPlan


@dataclass(frozen=True)
class BeginInner:
    """Semi-synchronous: inner step `index` (0..H-1) of the outer step `step` starts on the
    replica's own group; at index 0 the model holds the global state (keep a copy of it)."""
    step: int
    index: int


@dataclass(frozen=True)
class InnerStep:
    """The script's optimizer steps on this inner step's gradients (no one outside the replica)."""
    step: int
    index: int


@dataclass(frozen=True)
class TakePseudoGradient:
    """After the last inner step before a sync (streaming_diloco with an overlap: sync_overlap_steps
    before it): pseudo-gradient = global - local of `fragment` (kept for every attempt of the
    sync); its model tensors go back to the global state, unless `keep_local` (they train on
    during the overlap)."""
    step: int
    fragment: int = 0                   # the fragment this sync carries (streaming_diloco; else 0)
    keep_local: bool = False


@dataclass(frozen=True)
class ReducePseudoGradient:
    """Average the pseudo-gradient across the sync's contributors (zeros when behind; every
    rank runs it, with or without a plan), then feed Reduced."""
    plan: RankPlan | None
    fragment: int = 0                   # the quorum's fragment: that of the plan's step
    planned_ahead: bool = False         # its plan was asked for ahead and in by the due step


@dataclass(frozen=True)
class StartReduce:
    """A sync in flight (streaming_diloco's overlap): start this rank's cross-replica part of the
    pseudo-gradient's average in the background -- no collective inside the replica -- and feed
    Reduced once it is done (the Manager's flight waker is woken by its end)."""
    plan: RankPlan
    fragment: int


@dataclass(frozen=True)
class AwaitReduce:
    """The due step came while the started reduce still runs: wait for it (bounded by the FTAR
    timeout), then feed Reduced."""


@dataclass(frozen=True)
class GatherReduced:
    """The commit of a reduce started in flight, at the due step on every rank: a replicated
    replica's ranks all-gather their averaged parts (nothing to do when sharded or one rank)."""
    fragment: int


@dataclass(frozen=True)
class DropReduce:
    """A sync in flight ends without a commit: forget its reduce; the next attempt rebuilds the
    ring. The inner steps and their gradients are untouched."""
    reason: str


@dataclass(frozen=True)
class ApplyOuterStep:
    """Commit of a sync: the outer optimizer applies the average to the global state (outer
    learning rate × plan.lr_scale) to `fragment`; its model tensors take the new global state;
    registered state moves on."""
    plan: RankPlan
    fragment: int = 0


@dataclass(frozen=True)
class DropGradients:
    """Retry: drop this attempt's gradients; the weights are untouched."""
    reason: str


@dataclass(frozen=True)
class SendDigest:
    attempt: int
    step: int                           # the step just committed


@dataclass(frozen=True)
class Checkpoint:
    step: int                           # the next step: the checkpoint is the state at its start
    write_state: bool                   # model + optimizer + registered state (one replica)


@dataclass(frozen=True)
class Concluded:
    outcome: StepOutcome


@dataclass(frozen=True)
class SendClose:
    step: int
    reason: str


@dataclass(frozen=True)
class Closed:
    clean: bool
    reason: str


@dataclass(frozen=True)
class Ended:
    reason: str


@dataclass(frozen=True)
class Fail:
    message: str
    retries_exhausted: bool = False


Effect = Union[SendBegin, ServeState, StopServing, ConfigureRing, StartFetch, CancelFetch, AdoptFetched,
               LoadCheckpoint, SendVote, ApplyStep, BeginInner, InnerStep, TakePseudoGradient, ReducePseudoGradient,
               StartReduce, AwaitReduce, GatherReduced, DropReduce, ApplyOuterStep, DropGradients, SendDigest,
               Checkpoint, Concluded, SendClose, Closed, Ended, Fail]
