"""Replicas that finish, and the job that completes. Time passed in.

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
from controller.core.model import DeathCause, JobState, Replica, ReplicaState


class JobLifecycle:
    """Mixin of ControllerState: FINISHED replicas and the COMPLETED job."""

    @property
    def job_state(self) -> JobState:
        return JobState.COMPLETED if self.completed_at is not None else JobState.RUNNING

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
        if self.completed_at is not None or not self.replicas:
            return
        states = [r.state for r in self.replicas.values()]
        if not all(s in (ReplicaState.FINISHED, ReplicaState.DEAD) for s in states):
            return
        finished = states.count(ReplicaState.FINISHED)
        if not finished:
            return
        self.completed_at = now
        self.dirty_replicas = True
        self.round_reason = "the job is COMPLETED"
        self._event(now, "job", self.settings.job_id,
                    f"job {self.settings.job_id} COMPLETED: {finished} replica(s) finished, "
                    f"{len(states) - finished} dead")

    def _trainer_exited(self, host_id: str, replica_id: str, rank: int, exit_code: int, signal: int,
                        why: str, now: float) -> bool:
        """Record a trainer's exit; True when it is a death its replica must recover from
        (False: a clean finish, or the replica or job is done)."""
        r = self.replicas.get(replica_id)
        clean = exit_code == 0 and not signal
        done = self.completed_at is not None or (r is not None and r.state == ReplicaState.FINISHED)
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
