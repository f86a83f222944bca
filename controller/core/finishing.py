"""Replicas that finish, and the job that completes or fails. Time passed in.

    RUNNING ──(every replica FINISHED or DEAD, at least one FINISHED)──▶ COMPLETED
    RUNNING ──(no replica can make progress for fail_after_s)──▶ FAILED

Both endings are final, durable (persisted with their time and reason) and carry a reason
(`job_state_reason`); no quorum forms after either, agents learn it and exit (0 COMPLETED,
non-zero FAILED: agent/main.py), and a leader's join is refused with a message naming the
state. When the job is FAILED is decided by controller.core.job_failure.

A leader reports its replica finished (`report_finished`): the replica becomes FINISHED. The
job is COMPLETED once every registered replica is FINISHED or DEAD and at least one finished.
COMPLETED is final and durable: no quorum forms after it (a join is refused with a message
that says COMPLETED), agents learn it from heartbeat and registration answers and stop.

A trainer that exits with code 0 after its replica finished (or after the job completed) ends
normally: an event, no death. Exiting 0 earlier is still a death: the replica had not
finished.
"""

from __future__ import annotations

from controller.core.checks import check_id, clip_text
from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.job_failure import ReplicaOutlook, failure_decision, stuck_reason
from controller.core.model import DeathCause, HostState, JobState, Replica, ReplicaState
from controller.core.pending_writes import REPLICAS
from controller.core.restarts import host_can_run


class JobLifecycle:
    """Mixin of ControllerState: FINISHED replicas, the COMPLETED job and the FAILED one."""

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

    def check_progress(self, now: float) -> None:
        """FAIL the job once no replica could make progress for fail_after_s (called on the tick)."""
        if self.job_over:
            return
        decision = failure_decision(self._stuck_reason(), self.stuck_since, now, self.settings.fail_after_s)
        if decision.stuck_since is not None and self.stuck_since is None:
            self._event(now, "job_stuck", self.settings.job_id, f"job {self.settings.job_id}: {decision.reason}")
        self.stuck_since, self.stuck_note = decision.stuck_since, clip_text(decision.reason, self.settings.max_reason_chars)
        if not decision.fail:
            return
        self.failed_at, self.job_end_reason = now, clip_text(decision.reason, self.settings.max_reason_chars)
        self.writes.mark(REPLICAS)
        self.round_reason, self.round_wake_at = "the job is FAILED", None
        self._event(now, "job_failed", self.settings.job_id, f"job {self.settings.job_id} FAILED: {decision.reason}")

    def _stuck_reason(self) -> str:
        live, dead = self._liveness()
        if live or len(dead) != len(self.replicas):
            return ""  # cheap first: a replica that is not DEAD (or FINISHED) can still train
        down: dict[str, str] = {}  # replica -> first host of it that cannot run ("" none)
        free_spares = 0
        for h in self.hosts.values():
            if h.state == HostState.SPARE and not h.cordoned:
                free_spares += 1
            if h.assignment is not None:
                rid = h.assignment.replica_id
                if not down.get(rid):
                    down[rid] = "" if host_can_run(h) else h.host_id
        if any(r.state == ReplicaState.FINISHED for r in self.replicas.values()):
            return ""  # a finished replica ends the job as COMPLETED instead
        outlooks = [ReplicaOutlook(rid, True, down.get(rid, "")) for rid in self.replicas]
        # a replica its hosts run but that never joined (its trainers die before their first join)
        outlooks += [ReplicaOutlook(rid, True, host) for rid, host in down.items() if rid not in self.replicas]
        return stuck_reason(outlooks, free_spares, self.settings.replicas)

    def report_finished(self, replica_id: str, step: int, now: float, *, reason: str = "",
                        host_id: str = "") -> JobState:
        r = self._known_replica(replica_id)
        self._check_leader_host(replica_id, host_id)
        if step < -1:
            raise InvalidArgument(f"step must be -1 (nothing committed) or more, got {step}.")
        reason = clip_text(reason, self.settings.max_reason_chars)
        if step > max(r.given_step, r.committed_step):
            raise FailedPrecondition(
                f"replica {replica_id} reports it finished at step {step}, but no quorum gave it a step after "
                f"{max(r.given_step, r.committed_step)}; a replica cannot have committed a step it was not given.")
        if step < r.committed_step and r.state != ReplicaState.FINISHED:
            raise FailedPrecondition(
                f"replica {replica_id} reports it finished at step {step}, but it already committed step "
                f"{r.committed_step}; steps never go backwards.")
        # Validated: from here on the request changes state.
        r.last_seen = now
        if r.state == ReplicaState.FINISHED:
            return self.job_state  # said again (a retried call): nothing new
        if step > r.committed_step:  # its last step report was lost: the replica knows best
            r.committed_step, r.step = step, step + 1
            self.max_committed_step = max(self.max_committed_step, step)
        self.round_joined.pop(replica_id, None)
        if not self.round_joined:
            self.round_first_join_at = None
        self._transition(r, ReplicaState.FINISHED,
                         f"finished after step {step}" + (f": {clip_text(reason, 200)}" if reason else ""), now)
        return self.job_state

    # -- hooks called by joins, deaths and trainer exits -------------------------------------------

    def _check_join_allowed(self, replica_id: str, r: Replica | None, restarted: bool) -> None:
        if self.failed_at is not None:
            raise FailedPrecondition(
                f"job {self.settings.job_id} is FAILED: {self.job_end_reason}; replica {replica_id} may not join "
                f"a quorum.")
        if self.completed_at is not None:
            raise FailedPrecondition(
                f"job {self.settings.job_id} is COMPLETED: every replica finished or died; replica "
                f"{replica_id} may not join a quorum.")
        if r is not None and r.state == ReplicaState.FINISHED and not restarted:
            raise FailedPrecondition(
                f"replica {replica_id} is FINISHED ({r.reason}); only a new process (a new incarnation) may "
                f"train it again.")

    def _check_completed(self, now: float) -> None:
        """Called whenever a replica becomes FINISHED or DEAD."""
        if self.job_over or not self.replicas:
            return
        states = [r.state for r in self.replicas.values()]
        if not all(s in (ReplicaState.FINISHED, ReplicaState.DEAD) for s in states):
            return
        finished = states.count(ReplicaState.FINISHED)
        if not finished:
            return
        self.completed_at = now
        self.job_end_reason = f"{finished} replica(s) finished, {len(states) - finished} dead"
        self.writes.mark(REPLICAS)
        self.round_reason = "the job is COMPLETED"
        self._event(now, "job", self.settings.job_id, f"job {self.settings.job_id} COMPLETED: {self.job_end_reason}")

    def _trainer_exited(self, host_id: str, replica_id: str, rank: int, exit_code: int, signal: int,
                        why: str, now: float) -> bool:
        """Record a trainer's exit; True when it is a death its replica must recover from
        (False: a clean finish, or the replica or job is done)."""
        r = self.replicas.get(replica_id)
        clean = exit_code == 0 and not signal
        done = self.job_over or (r is not None and r.state == ReplicaState.FINISHED)
        if clean and done:
            if replica_id not in self.finished_exits:
                self.finished_exits.add(replica_id)  # one event per replica, not one per rank
                self._event(now, "finished", replica_id,
                            f"replica {replica_id} finished: trainer rank {rank} on host {host_id} exited with code 0")
            return False
        if clean:
            why = f"trainer rank {rank} on host {host_id} exited cleanly before its replica finished"
        self.kill_replica(replica_id, DeathCause.TRAINER_EXIT, why, now)
        return not done
