"""The agent's decisions, pure: what one trainer slot should do next.

(Which controller to reconnect to, and when, is `protos.dial.AddressRotation`: the trainer
runtime follows the same rule.)

No process, clock, gRPC or asyncio here: the supervisor observes, calls `next_action`, and
executes the answer. Time arrives as `Observed.now_s` (any monotonic clock, seconds).

A slot is one trainer process place on the host (one GPU). Its life, as driven by the
supervisor executing `next_action` (the state diagram):

    empty --START--> running(standby | trainer)
    running(standby) --SWAP_IN--> running(trainer)          ASSIGN arrived; imports already done
    running --STOP--> empty                                  not wanted / placement or generation changed /
                                                             its replica halted
    running --exits--> exited
    exited(trainer) --HALT_REPLICA--> halted                 reported; every slot of its replica halts (the
                                                             running ones are stopped): the controller
                                                             restarts the replica on all its hosts together
    exited(standby) --RESTART--> running                     budget allows another local restart
    exited(standby) --GIVE_UP--> halted                      budget spent
    exited(code 0) --WAIT--> halted                          the trainer finished: no restart, no
                                                             warning (the controller tells a clean
                                                             finish from an early exit)
    halted --(new generation: an order)--> empty
    any --(job COMPLETED: every slot wants IDLE)--> empty    then the agent exits 0, or idles and
                                                             starts nothing, or (pool) waits for the
                                                             next job (`after_job_state`,
                                                             `serves_next_job`)
    running(trainer) --(job COMPLETED)--> finishing          after Manager.close() the process is the
                                                             user's (export, evaluation, upload): it
                                                             may exit on its own until
                                                             `Spec.finish_by_s` (the agent's
                                                             finish_grace_s after COMPLETED)
    finishing --exits--> exited                              reported like any exit (a clean one)
    finishing --(finish_by_s passed)--STOP--> empty          it did not exit within the grace

With warm restarts (`Spec.warm_restarts`) a slot that trains also holds a *reserve*: one
pre-started standby next to its trainer, decided by `reserve_action` (the same supervisor
pass, after `next_action`). When the trainer must be replaced (a RESTART order, a new
placement or generation, the replica's restart after a death) the old trainer is stopped as
before, and then, instead of a cold START, the reserve is swapped in:

    empty(reserve running) --SWAP_IN--> running(trainer)     the reserve takes the placement
    reserve: none --START--> running                          once the slot's trainer has run
                                                              for `Spec.reserve_delay_s`
    reserve: exited --RESTART--> running                      within the restart budget
    reserve: exited --GIVE_UP--> none                         budget spent: restarts are cold
                                                              until the window frees a restart
    reserve: running --STOP--> none                           the slot trains no more (idle,
                                                              spare pool, job completed)

A trainer is never restarted alone: its replica's ranks are one torch.distributed group, so
the controller restarts the replica as a unit (a RESTART order to each of its hosts) and keeps
the restart budget (ControllerSettings.restart_budget). The agent's own budget covers standby
trainers only. Every order that changes what a slot wants (ASSIGN, RESTART, START, RELEASE,
STOP) bumps the slot's `generation`; a halted slot stays halted until its generation changes.
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
    RESTART = "restart"    # a standby exited on its own and the budget allows a restart
    STOP = "stop"          # a process runs that the slot no longer wants
    SWAP_IN = "swap_in"    # a standby runs and the slot wants a trainer: hand it the assignment
    WAIT = "wait"          # nothing to do now
    GIVE_UP = "give_up"    # a standby exited and the restart budget is spent
    HALT_REPLICA = "halt_replica"  # a trainer died: halt every slot of its replica until an order


#: How a trainer still running after the job COMPLETED is shown (logs, REST).
FINISHING = "finishing"


def is_finishing(proc: "Proc | None", spec: "Spec") -> bool:
    """A trainer still running after the job COMPLETED (stopped once its finish grace is over)."""
    return (proc is not None and not proc.exited and proc.role is Role.TRAIN and spec.want.role is Role.IDLE
            and spec.finish_by_s is not None)


@dataclass(frozen=True)
class Placement:
    """Where one trainer sits: its replica and rank, its place on this host, and where the
    replica's ranks meet (the controller tells; "" when it does not know)."""

    replica_id: str
    rank: int
    world_size: int
    local_rank: int = 0           # its index among this host's ranks of the replica
    local_world_size: int = 1     # how many ranks of the replica this host runs
    rendezvous: str = ""          # MASTER_ADDR:MASTER_PORT (the replica's rank-0 host)
    coordinator: str = ""         # where rank 0 hosts the replica's coordinator

    def __str__(self) -> str:
        return f"replica {self.replica_id} rank {self.rank}"


@dataclass(frozen=True)
class Want:
    """What a slot should run. `generation` changes with every order touching the slot;
    `version` is the controller's assignment version it was decided under (it may move on
    without a restart, when the controller confirms what runs)."""

    role: Role
    generation: int = 0
    placement: Placement | None = None
    version: int = 0


@dataclass(frozen=True)
class Proc:
    """The process a slot holds, as last polled; `version`: the assignment version it was
    started under (reported with its exit)."""

    role: Role
    generation: int
    placement: Placement | None = None
    version: int = 0
    exited: bool = False
    exit_code: int | None = None   # None while running or when killed by a signal
    signal: int | None = None      # the signal that killed it, if any
    started_s: float | None = None  # when it started (or took its placement), on Observed's clock


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
    # The slot's reserve standby (warm restarts), as last polled, and when it was restarted.
    reserve: Proc | None = None
    reserve_restart_times_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Spec:
    want: Want
    budget: RestartBudget
    # Keep a pre-started reserve standby next to the slot's trainer (`reserve_action`), started
    # this long after the trainer (its imports would slow the trainer's own start).
    warm_restarts: bool = False
    reserve_delay_s: float = 0.0
    # The job COMPLETED: a trainer still running is *finishing* (its work after
    # Manager.close()) and may exit on its own until this time; then it is stopped. None: the
    # job runs (or FAILED), and a trainer nobody wants is stopped at once.
    finish_by_s: float | None = None


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
    halted = observed.halted_generation == want.generation

    if proc is not None and not proc.exited:
        # The job COMPLETED: a trainer's work after close is the user's, until the grace ends.
        if want.role is Role.IDLE and proc.role is Role.TRAIN and spec.finish_by_s is not None:
            if observed.now_s < spec.finish_by_s:
                return Action(ActionKind.WAIT, f"{FINISHING}: the job COMPLETED; it may exit on its own for "
                                               f"{spec.finish_by_s - observed.now_s:.0f} s more")
            return Action(ActionKind.STOP, "the job COMPLETED and it did not exit within the finish grace")
        # Nothing should run here (STOP order, or a spare without standby).
        if want.role is Role.IDLE:
            return Action(ActionKind.STOP, "no trainer is wanted on this slot")
        # A warm standby and an assignment: hand it over, imports are already done.
        if proc.role is Role.STANDBY and want.role is Role.TRAIN:
            return Action(ActionKind.SWAP_IN, f"standby takes {want.placement}")
        if proc.role is Role.STANDBY and want.role is Role.STANDBY:
            return Action(ActionKind.WAIT, "standby is waiting for an assignment")
        # A trainer runs but the host went back to the pool.
        if want.role is Role.STANDBY:
            return Action(ActionKind.STOP, "host was released to the spare pool")
        # Both are trainers: a different placement or a RESTART order stops the old one.
        if want.placement != proc.placement:
            return Action(ActionKind.STOP, f"placement changed to {want.placement}")
        if proc.generation != want.generation:
            return Action(ActionKind.STOP, f"restart ordered (generation {want.generation})")
        # Another rank of its replica died here: the replica restarts as a unit.
        if halted:
            return Action(ActionKind.STOP, "another rank of its replica died; the replica restarts as a unit")
        return Action(ActionKind.WAIT, "trainer is running")

    if proc is not None:  # it exited on its own
        what = ("trainer " if proc.role is Role.TRAIN else "standby trainer ") + describe_exit(proc)
        # Nobody wants it any more: nothing to restart.
        if want.role is Role.IDLE or proc.generation != want.generation:
            return Action(ActionKind.WAIT, f"{what}; it is no longer wanted")
        # A trainer that exits 0 finished its job: do not run it again.
        if proc.role is Role.TRAIN and proc.exit_code == 0:
            return Action(ActionKind.WAIT, f"{what}; training finished")
        # Never restarted alone: its replica's ranks restart together when the controller says.
        if proc.role is Role.TRAIN:
            return Action(ActionKind.HALT_REPLICA, f"{what}; its replica waits for the controller to "
                                                   "restart it on all its hosts")
        used = restarts_in_window(observed.restart_times_s, observed.now_s, spec.budget.window_s)
        budget = f"{used} of {spec.budget.restarts} restarts used in {spec.budget.window_s:g} s"
        # The restart budget stops restart storms of a standby.
        if used >= spec.budget.restarts:
            return Action(ActionKind.GIVE_UP, f"{what}; restart budget exhausted ({budget})")
        return Action(ActionKind.RESTART, f"{what}; restarting ({budget})")

    # Nothing runs.
    if want.role is Role.IDLE:
        return Action(ActionKind.WAIT, "slot is idle")
    # Gave up, finished, or its replica halted, for this generation: wait for an order.
    if halted:
        return Action(ActionKind.WAIT, f"slot halted at generation {want.generation}; "
                                       "waiting for an order")
    if want.role is Role.STANDBY:
        return Action(ActionKind.START, "pre-starting a standby trainer")
    # The reserve's imports are done: it takes the placement (warm restart).
    reserve = observed.reserve
    if reserve is not None and not reserve.exited and reserve.role is Role.STANDBY:
        return Action(ActionKind.SWAP_IN, f"reserve standby takes {want.placement}")
    return Action(ActionKind.START, f"starting {want.placement}")


def reserve_action(observed: Observed, spec: Spec) -> Action:
    """Decide what the slot's reserve standby does next (warm restarts). START/RESTART start a
    standby as a reserve, STOP stops it, GIVE_UP forgets an exited one without a restart."""
    want, reserve, proc = spec.want, observed.reserve, observed.proc
    wanted = spec.warm_restarts and want.role is Role.TRAIN
    used = restarts_in_window(observed.reserve_restart_times_s, observed.now_s, spec.budget.window_s)
    budget = f"{used} of {spec.budget.restarts} restarts used in {spec.budget.window_s:g} s"

    if reserve is not None and not reserve.exited:
        if not spec.warm_restarts:
            return Action(ActionKind.STOP, "warm restarts are off")
        if not wanted:
            return Action(ActionKind.STOP, "the slot trains no more: its reserve is not needed")
        return Action(ActionKind.WAIT, "reserve standby is ready")

    if reserve is not None:  # it exited on its own
        what = "reserve standby " + describe_exit(reserve)
        if not wanted:
            return Action(ActionKind.WAIT, f"{what}; it is no longer wanted")
        # The same budget as a spare's standby: no restart storm.
        if used >= spec.budget.restarts:
            return Action(ActionKind.GIVE_UP, f"{what}; restart budget exhausted ({budget}): restarts are cold")
        return Action(ActionKind.RESTART, f"{what}; restarting it ({budget})")

    if not wanted:
        return Action(ActionKind.WAIT, "no reserve is wanted")
    if proc is None or proc.exited or proc.role is not Role.TRAIN:
        return Action(ActionKind.WAIT, "a reserve starts once the slot's trainer runs")
    if used >= spec.budget.restarts:
        return Action(ActionKind.WAIT, f"reserve restart budget exhausted ({budget}): restarts are cold")
    if proc.started_s is not None and observed.now_s - proc.started_s < spec.reserve_delay_s:
        return Action(ActionKind.WAIT, f"a reserve starts {spec.reserve_delay_s:g} s after its trainer")
    return Action(ActionKind.START, f"pre-starting a reserve standby next to {proc.placement}")


def keep_trainers_past_timeout(outage_s: float, limit_s: float, answered: bool, trainers: int) -> str:
    """Whether an agent whose controller has been silent for `outage_s`, past its reconnect
    timeout `limit_s`, keeps trying instead of giving up (and stopping its trainers): the reason
    to keep trying, or "" to give up. Trainers that trained hold the replica's state, perhaps
    the only copy since the last checkpoint; they wait at their next quorum, so a controller
    that comes back finds them. The wait is bounded: twice the timeout."""
    # A first connection never answered: nothing trained here, a configuration error shows.
    if not answered:
        return ""
    # Nothing runs that a longer wait could save.
    if trainers == 0:
        return ""
    # Bounded: a controller gone this long is not coming back for these trainers.
    if outage_s > 2 * limit_s:
        return ""
    return (f"{trainers} trainer(s) still run and hold their replica's state: kept (they wait at their next "
            f"quorum) while the agent retries, up to {2 * limit_s:g} s without a controller")


class JobEnd(enum.Enum):
    RUN = "run"      # the job runs: slots do what orders want
    EXIT = "exit"    # the job COMPLETED (FAILED): stop every trainer gracefully, then the agent exits 0 (4)
    IDLE = "idle"    # the job COMPLETED: stop every trainer, stay registered, start nothing
    POOL = "pool"    # the job ended: stop every trainer, stay, and serve the next job the controller
                     # address answers for (`serves_next_job`); waits for it without giving up


#: What an agent does once the job is COMPLETED (the `on_job_complete` setting).
ON_JOB_COMPLETE = (JobEnd.EXIT.value, JobEnd.IDLE.value, JobEnd.POOL.value)


def serves_next_job(on_job_complete: str, ended_job: str, answered_job: str, running: bool) -> bool:
    """A pool agent (`--on-job-complete pool`) whose job ended goes back to work once its
    controller address answers for another job id, and that job runs. The same id answering
    again (the ended job's own controller, a standby of it) keeps it in the pool."""
    return on_job_complete == JobEnd.POOL.value and answered_job != ended_job and running


def gives_up_on_controller(on_job_complete: str, serving: bool) -> bool:
    """Whether a controller outage longer than connect_timeout_s ends the agent. A pool agent
    that serves no job (none yet, or its job ended) waits for the next one's controller."""
    return serving or on_job_complete != JobEnd.POOL.value


def after_job_state(completed: bool, on_job_complete: str) -> JobEnd:
    """What the whole host does, given the job state the controller last told."""
    if not completed:
        return JobEnd.RUN
    return JobEnd(on_job_complete)

