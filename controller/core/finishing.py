"""Replicas that finish, and the job that completes or fails: `JobLifecycle`, which owns the
job's state and makes its moves (drawn in controller.core.model.JobState, with the table
JOB_MOVES it checks). Time passed in.

While no replica can make progress and the job has not FAILED yet it is *failing*
(`failing_since`; REST and the status page show FAILING with the time left).

Both endings are final, durable (persisted with their time and reason) and carry a reason
(`job_state_reason`); no quorum forms after either, agents learn it and exit (0 COMPLETED,
non-zero FAILED: agent/main.py), and a coordinator's join is refused with a message naming the
state. When the job is FAILED is decided by controller.core.job_failure.

A replica's coordinator reports it finished (`ControllerState.report_finished`): the replica
becomes FINISHED. The job is COMPLETED once every registered replica is FINISHED or DEAD and at
least one finished (`replica_settled`). COMPLETED is final and durable: no quorum forms after it
(a join is refused with a message that says COMPLETED), agents learn it from heartbeat and
registration answers and stop.

A trainer that exits with code 0 after its replica finished (or after the job completed) ends
normally: an event, no death. Exiting 0 earlier is still a death: the replica had not
finished.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.core.checks import clip_text
from controller.core.errors import FailedPrecondition
from controller.core.intents import Announce, EndRounds, Intent, KillReplica, Persist
from controller.core.job_failure import ReplicaOutlook, crash_loop_cause, failure_decision, stuck_reason
from controller.core.model import (
    JOB_MOVES, DeathCause, Host, HostState, JobState, Replica, ReplicaState, check_move, host_can_run,
)
from controller.core.pending_writes import REPLICAS
from controller.settings import ControllerSettings


class JobLifecycle:
    """The job's state (RUNNING, COMPLETED, FAILED) with its reason, and the clean exits told."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        #: when the job became COMPLETED (None: it runs); final, and persisted
        self.completed_at: float | None = None
        #: when the job became FAILED (None: it did not); final, and persisted
        self.failed_at: float | None = None
        #: why the job COMPLETED or FAILED (persisted); while it runs, since when no replica
        #: could make progress and the note that says so (not persisted: a new leader waits anew)
        self.job_end_reason = ""
        self.stuck_since: float | None = None
        self.stuck_note = ""
        #: finished replicas whose trainers' clean exit was already told in an event
        self.finished_exits: set[str] = set()
        #: replica -> why its trainers last died ("exit code 1: <stderr's last line>"), for the
        #: crash-loop rule (not persisted: a new leader waits fail_after_s)
        self.exit_causes: dict[str, str] = {}

    @property
    def job_state(self) -> JobState:
        if self.completed_at is not None:
            return JobState.COMPLETED
        return JobState.FAILED if self.failed_at is not None else JobState.RUNNING

    @property
    def job_over(self) -> bool:
        """COMPLETED or FAILED: final."""
        return self.completed_at is not None or self.failed_at is not None

    @property
    def job_state_reason(self) -> str:
        """Why the job ended; while it runs, why it is about to fail ("" when it is not)."""
        return self.job_end_reason if self.job_over else self.stuck_note

    def restore(self, completed_at: float | None, failed_at: float | None, reason: str) -> None:
        self.completed_at, self.failed_at, self.job_end_reason = completed_at, failed_at, reason

    def check_progress(self, replicas: Mapping[str, Replica], hosts: Iterable[Host], any_live: bool,
                       committed_any: bool, now: float) -> list[Intent]:
        """FAIL the job once no replica could make progress for fail_after_s, or at once for a
        crash loop before any committed step (called on the tick). `any_live`: a replica is
        neither DEAD nor FINISHED; `committed_any`: the job ever committed a step."""
        if self.job_over:
            return []
        job_id, job = self.settings.job_id, job_name(self.settings.job_id)
        view = None if any_live else _outlooks(replicas, hosts, self.exit_causes)
        reason = stuck_reason(view[0], view[1], self.settings.replicas) if view is not None else ""
        crash = crash_loop_cause(view[0], committed_any) if reason and view is not None else ""
        decision = failure_decision(reason, self.stuck_since, now, self.settings.fail_after_s, crash)
        out: list[Intent] = []
        if decision.stuck_since is not None and self.stuck_since is None and not decision.fail:
            out.append(Announce("job_stuck", job_id, f"{job} is FAILING: {decision.reason}"))
        self.stuck_since, self.stuck_note = decision.stuck_since, clip_text(decision.reason, self.settings.max_reason_chars)
        if not decision.fail:
            return out
        check_move(JOB_MOVES, job, self.job_state, JobState.FAILED)
        self.failed_at, self.job_end_reason = now, clip_text(decision.reason, self.settings.max_reason_chars)
        return out + [Persist(REPLICAS), EndRounds("the job is FAILED"),
                      Announce("job_failed", job_id, f"{job} FAILED: {decision.reason}")]

    @property
    def failing_since(self) -> float | None:
        """Since when the running job could make no progress (None: it can, or it ended)."""
        return None if self.job_over else self.stuck_since

    def join_refusal(self, replica_id: str) -> str:
        """Why no join is answered any more once the job ended ("" while it runs)."""
        if self.failed_at is not None:
            return (f"{job_name(self.settings.job_id)} is FAILED: {self.job_end_reason}; replica {replica_id} may "
                    f"not join a quorum.")
        if self.completed_at is not None:
            return (f"{job_name(self.settings.job_id)} is COMPLETED: every replica finished or died; replica "
                    f"{replica_id} may not join a quorum.")
        return ""

    def check_join_allowed(self, replica_id: str, r: Replica | None, restarted: bool) -> None:
        """Refuse a join once the job ended, or of a FINISHED replica's same process."""
        refusal = self.join_refusal(replica_id)
        if refusal:
            raise FailedPrecondition(refusal)
        if r is not None and r.state == ReplicaState.FINISHED and not restarted:
            raise FailedPrecondition(
                f"replica {replica_id} is FINISHED ({r.reason}); only a new process (a new incarnation) may "
                f"train it again.")

    def trains_again(self, replica_id: str) -> None:
        """A FINISHED replica's new process joins: its next clean exit is told again."""
        self.finished_exits.discard(replica_id)

    def replica_settled(self, replicas: Mapping[str, Replica], now: float) -> list[Intent]:
        """Called whenever a replica becomes FINISHED or DEAD: the job COMPLETES once every
        replica is FINISHED or DEAD and one finished."""
        if self.job_over or not replicas:
            return []
        states = [r.state for r in replicas.values()]
        if not all(s in (ReplicaState.FINISHED, ReplicaState.DEAD) for s in states):
            return []
        finished = states.count(ReplicaState.FINISHED)
        if not finished:
            return []
        job = job_name(self.settings.job_id)
        check_move(JOB_MOVES, job, self.job_state, JobState.COMPLETED)
        self.completed_at = now
        self.job_end_reason = f"{finished} replica(s) finished, {len(states) - finished} dead"
        return [Persist(REPLICAS), EndRounds("the job is COMPLETED"),
                Announce("job", self.settings.job_id, f"{job} COMPLETED: {self.job_end_reason}")]

    def trainer_exited(self, r: Replica | None, host_id: str, replica_id: str, rank: int, exit_code: int,
                       signal: int, why: str, cause: str = "") -> tuple[bool, list[Intent]]:
        """A trainer's exit: (whether it is a death its replica must recover from, intents).
        False: a clean finish, or the replica or job is done. `cause`: the death's cause without
        its host and rank (`HostRegistry.trainer_exited`), kept for the crash-loop rule."""
        clean = exit_code == 0 and not signal
        done = self.job_over or (r is not None and r.state == ReplicaState.FINISHED)
        if clean and done:
            if replica_id in self.finished_exits:
                return False, []
            self.finished_exits.add(replica_id)  # one event per replica, not one per rank
            return False, [Announce("finished", replica_id, f"replica {replica_id} finished: trainer rank {rank} "
                                                            f"on host {host_id} exited with code 0")]
        if clean:
            why = f"trainer rank {rank} on host {host_id} exited cleanly before its replica finished"
            cause = "exit code 0 before the replica finished"
        if not done:
            self.exit_causes[replica_id] = cause
        return not done, [KillReplica(replica_id, DeathCause.TRAINER_EXIT, why)]


def _outlooks(replicas: Mapping[str, Replica], hosts: Iterable[Host],
              exit_causes: Mapping[str, str]) -> tuple[list[ReplicaOutlook], int] | None:
    """What the failure rule needs (every replica is DEAD or FINISHED): each replica's outlook
    and the free spares; None when a replica finished (the job COMPLETES instead)."""
    if any(r.state == ReplicaState.FINISHED for r in replicas.values()):
        return None
    down: dict[str, Host | None] = {}  # replica -> first host of it that cannot run (None: none)
    free_spares = 0
    for h in hosts:
        if h.state == HostState.SPARE and not h.cordoned:
            free_spares += 1
        if h.assignment is not None:
            rid = h.assignment.replica_id
            if down.get(rid) is None:
                down[rid] = None if host_can_run(h) else h

    def outlook(rid: str) -> ReplicaOutlook:
        h = down.get(rid)
        if h is None:
            return ReplicaOutlook(rid, True)
        # cordoned after a failure while its agent lives: its trainers spent the restart budget
        spent = h.state != HostState.DEAD
        return ReplicaOutlook(rid, True, h.host_id, exit_causes.get(rid, "") if spent else "")

    # with the replicas its hosts run but that never joined (their trainers die before a join)
    return [outlook(rid) for rid in sorted(set(replicas) | set(down))], free_spares


def job_name(job_id: str) -> str:
    """The job as sentences name it: `job "job"` reads well whatever the id is."""
    return f'job "{job_id}"'
