"""Replicas that finish, and the job that completes or fails. Time passed in.

    RUNNING ──(every replica FINISHED or DEAD, at least one FINISHED)──▶ COMPLETED
    RUNNING ──(no replica can make progress for fail_after_s)──▶ FAILED

Both endings are final, durable (persisted with their time and reason) and carry a reason
(`job_state_reason`); no quorum forms after either, agents learn it and exit (0 COMPLETED,
non-zero FAILED: agent/main.py), and a leader's join is refused with a message naming the
state. When the job is FAILED is decided by controller.core.job_failure.

A leader reports its replica finished (`ControllerState.report_finished`): the replica becomes FINISHED. The
job is COMPLETED once every registered replica is FINISHED or DEAD and at least one finished.
COMPLETED is final and durable: no quorum forms after it (a join is refused with a message
that says COMPLETED), agents learn it from heartbeat and registration answers and stop.

A trainer that exits with code 0 after its replica finished (or after the job completed) ends
normally: an event, no death. Exiting 0 earlier is still a death: the replica had not
finished.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.core.checks import clip_text
from controller.core.errors import FailedPrecondition
from controller.core.intents import Announce, EndRounds, Intent, KillReplica, Persist
from controller.core.job_failure import ReplicaOutlook, failure_decision, stuck_reason
from controller.core.model import DeathCause, Host, HostState, JobState, Replica, ReplicaState, host_can_run
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
                       now: float) -> list[Intent]:
        """FAIL the job once no replica could make progress for fail_after_s (called on the
        tick). `any_live`: a replica is neither DEAD nor FINISHED."""
        if self.job_over:
            return []
        job = self.settings.job_id
        reason = "" if any_live else _stuck_reason(replicas, hosts, self.settings.replicas)
        decision = failure_decision(reason, self.stuck_since, now, self.settings.fail_after_s)
        out: list[Intent] = []
        if decision.stuck_since is not None and self.stuck_since is None:
            out.append(Announce("job_stuck", job, f"job {job}: {decision.reason}"))
        self.stuck_since, self.stuck_note = decision.stuck_since, clip_text(decision.reason, self.settings.max_reason_chars)
        if not decision.fail:
            return out
        self.failed_at, self.job_end_reason = now, clip_text(decision.reason, self.settings.max_reason_chars)
        return out + [Persist(REPLICAS), EndRounds("the job is FAILED"),
                      Announce("job_failed", job, f"job {job} FAILED: {decision.reason}")]

    def join_refusal(self, replica_id: str) -> str:
        """Why no join is answered any more once the job ended ("" while it runs)."""
        if self.failed_at is not None:
            return (f"job {self.settings.job_id} is FAILED: {self.job_end_reason}; replica {replica_id} may not join "
                    f"a quorum.")
        if self.completed_at is not None:
            return (f"job {self.settings.job_id} is COMPLETED: every replica finished or died; replica "
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
        job = self.settings.job_id
        self.completed_at = now
        self.job_end_reason = f"{finished} replica(s) finished, {len(states) - finished} dead"
        return [Persist(REPLICAS), EndRounds("the job is COMPLETED"),
                Announce("job", job, f"job {job} COMPLETED: {self.job_end_reason}")]

    def trainer_exited(self, r: Replica | None, host_id: str, replica_id: str, rank: int, exit_code: int,
                       signal: int, why: str) -> tuple[bool, list[Intent]]:
        """A trainer's exit: (whether it is a death its replica must recover from, intents).
        False: a clean finish, or the replica or job is done."""
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
        return not done, [KillReplica(replica_id, DeathCause.TRAINER_EXIT, why)]


def _stuck_reason(replicas: Mapping[str, Replica], hosts: Iterable[Host], configured: int) -> str:
    """Why no replica can make progress (every replica is DEAD or FINISHED), or ""."""
    down: dict[str, str] = {}  # replica -> first host of it that cannot run ("" none)
    free_spares = 0
    for h in hosts:
        if h.state == HostState.SPARE and not h.cordoned:
            free_spares += 1
        if h.assignment is not None:
            rid = h.assignment.replica_id
            if not down.get(rid):
                down[rid] = "" if host_can_run(h) else h.host_id
    if any(r.state == ReplicaState.FINISHED for r in replicas.values()):
        return ""  # a finished replica ends the job as COMPLETED instead
    outlooks = [ReplicaOutlook(rid, True, down.get(rid, "")) for rid in replicas]
    # a replica its hosts run but that never joined (its trainers die before their first join)
    outlooks += [ReplicaOutlook(rid, True, host) for rid, host in down.items() if rid not in replicas]
    return stuck_reason(outlooks, free_spares, configured)
