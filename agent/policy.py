"""The agent's decisions, pure: what one trainer slot should do next.

(Which controller to reconnect to, and when, is `protos.dial.AddressRotation`: the trainer
runtime follows the same rule.)

No process, clock, gRPC or asyncio here: the supervisor observes, calls `next_action`, and
executes the answer. Time arrives as `Observed.now_s` (any monotonic clock, seconds).

A slot is one trainer process place on the host (one GPU). Its life, as driven by the
supervisor executing `next_action` (the state diagram):

    empty --START--> running(standby | trainer)
    running(standby) --SWAP_IN--> running(trainer)          ASSIGN arrived; imports already done
    running --STOP--> empty                                  not wanted / assignment or generation changed
    running --exits--> exited
    exited --RESTART--> running                              budget allows another local restart
    exited --GIVE_UP--> halted                               budget spent; the controller swaps the host
    exited(code 0) --WAIT--> halted                          the trainer finished: no restart, no
                                                             warning (the controller tells a clean
                                                             finish from an early exit)
    halted --(new generation: an order)--> empty
    any --(job COMPLETED: every slot wants IDLE)--> empty    then the agent exits 0, or idles and
                                                             starts nothing (`after_job_state`)

Every order that changes what a slot wants (ASSIGN, RESTART, START, RELEASE, STOP) bumps the
slot's `generation`; a halted slot stays halted until its generation changes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    IDLE = "idle"          # nothing should run
    STANDBY = "standby"    # a pre-started trainer without an assignment (warm spare)
    TRAIN = "train"        # a trainer for (replica_id, rank)


class ActionKind(enum.Enum):
    START = "start"        # nothing runs; start what the slot wants (trainer or standby)
    RESTART = "restart"    # the trainer exited on its own and the budget allows a restart
    STOP = "stop"          # a process runs that the slot no longer wants
    SWAP_IN = "swap_in"    # a standby runs and the slot wants a trainer: hand it the assignment
    WAIT = "wait"          # nothing to do now
    GIVE_UP = "give_up"    # the trainer exited and the restart budget is spent


@dataclass(frozen=True)
class Want:
    """What a slot should run. `generation` changes with every order touching the slot."""

    role: Role
    generation: int = 0
    replica_id: str = ""
    rank: int = -1
    world_size: int = 0

    def same_assignment(self, other: "Want | Proc") -> bool:
        return (self.replica_id, self.rank, self.world_size) == (
            other.replica_id, other.rank, other.world_size)


@dataclass(frozen=True)
class Proc:
    """The process a slot holds, as last polled."""

    role: Role
    generation: int
    replica_id: str = ""
    rank: int = -1
    world_size: int = 0
    exited: bool = False
    exit_code: int | None = None   # None while running or when killed by a signal
    signal: int | None = None      # the signal that killed it, if any


@dataclass(frozen=True)
class RestartBudget:
    """At most `restarts` local restarts within any `window_s` seconds; beyond that, give up."""

    restarts: int
    window_s: float


@dataclass(frozen=True)
class Observed:
    now_s: float
    proc: Proc | None
    # When the slot's earlier local restarts happened (same clock as now_s).
    restart_times_s: tuple[float, ...] = ()
    # The generation for which the slot stopped trying (gave up or finished), if any.
    halted_generation: int | None = None


@dataclass(frozen=True)
class Spec:
    want: Want
    budget: RestartBudget


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str


def restarts_in_window(times_s: tuple[float, ...], now_s: float, window_s: float) -> int:
    """How many restarts happened in the window (now_s - window_s, now_s]."""
    return sum(1 for t in times_s if now_s - window_s < t <= now_s)


def describe_exit(proc: Proc) -> str:
    if proc.signal:
        return f"was killed by signal {proc.signal}"
    return f"exited with code {proc.exit_code}"


def next_action(observed: Observed, spec: Spec) -> Action:
    """Decide what one slot does next. Rules are ordered; the first that matches wins."""
    want, proc = spec.want, observed.proc

    if proc is not None and not proc.exited:
        # Nothing should run here (STOP order, or a spare without standby).
        if want.role is Role.IDLE:
            return Action(ActionKind.STOP, "no trainer is wanted on this slot")
        # A warm standby and an assignment: hand it over, imports are already done.
        if proc.role is Role.STANDBY and want.role is Role.TRAIN:
            return Action(ActionKind.SWAP_IN, f"standby takes replica {want.replica_id} "
                                              f"rank {want.rank}")
        if proc.role is Role.STANDBY and want.role is Role.STANDBY:
            return Action(ActionKind.WAIT, "standby is waiting for an assignment")
        # A trainer runs but the host went back to the pool.
        if want.role is Role.STANDBY:
            return Action(ActionKind.STOP, "host was released to the spare pool")
        # Both are trainers: a different assignment or a RESTART order stops the old one.
        if not want.same_assignment(proc):
            return Action(ActionKind.STOP, f"assignment changed to replica {want.replica_id} "
                                           f"rank {want.rank}")
        if proc.generation != want.generation:
            return Action(ActionKind.STOP, f"restart ordered (generation {want.generation})")
        return Action(ActionKind.WAIT, "trainer is running")

    if proc is not None:  # it exited on its own
        what = ("trainer " if proc.role is Role.TRAIN else "standby trainer ") + describe_exit(proc)
        # Nobody wants it any more: nothing to restart.
        if want.role is Role.IDLE or proc.generation != want.generation:
            return Action(ActionKind.WAIT, f"{what}; it is no longer wanted")
        # A trainer that exits 0 finished its job: do not run it again.
        if proc.role is Role.TRAIN and proc.exit_code == 0:
            return Action(ActionKind.WAIT, f"{what}; training finished")
        used = restarts_in_window(observed.restart_times_s, observed.now_s, spec.budget.window_s)
        budget = f"{used} of {spec.budget.restarts} restarts used in {spec.budget.window_s:g} s"
        # The restart budget stops restart storms; the controller then swaps the host.
        if used >= spec.budget.restarts:
            return Action(ActionKind.GIVE_UP, f"{what}; restart budget exhausted ({budget})")
        return Action(ActionKind.RESTART, f"{what}; restarting ({budget})")

    # Nothing runs.
    if want.role is Role.IDLE:
        return Action(ActionKind.WAIT, "slot is idle")
    # Gave up or finished for this generation: wait for an order.
    if observed.halted_generation == want.generation:
        return Action(ActionKind.WAIT, f"slot halted at generation {want.generation}; "
                                       "waiting for an order")
    if want.role is Role.STANDBY:
        return Action(ActionKind.START, "pre-starting a standby trainer")
    return Action(ActionKind.START, f"starting replica {want.replica_id} rank {want.rank}")


class JobEnd(enum.Enum):
    RUN = "run"      # the job runs: slots do what orders want
    EXIT = "exit"    # the job COMPLETED: stop every trainer gracefully, then the agent exits 0
    IDLE = "idle"    # the job COMPLETED: stop every trainer, stay registered, start nothing


#: What an agent does once the job is COMPLETED (the `on_job_complete` setting).
ON_JOB_COMPLETE = (JobEnd.EXIT.value, JobEnd.IDLE.value)


def after_job_state(completed: bool, on_job_complete: str) -> JobEnd:
    """What the whole host does, given the job state the controller last told."""
    if not completed:
        return JobEnd.RUN
    return JobEnd(on_job_complete)

