"""Replica registry and quorum rounds: joins, commits, failures, deaths. Time passed in."""

from __future__ import annotations

from dataclasses import replace

from controller.core.checks import (
    check_address, check_addresses, check_finite, check_id, check_non_negative, check_optional_id, clip_text,
)
from controller.core.diagnosis.sdc import check_rank_digests
from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.model import SETTLED, DeathCause, JobState, JoinRequest, Quorum, Replica, ReplicaState
from controller.core.pending_writes import REPLICAS, addresses_section
from controller.core.digests import check_digest
from controller.core.plausible import step_problem
from controller.core.quorum import RoundView, compute_quorum, form_quorum, quorate_since
from controller.core.replica_set import join_problem
from controller.core.rollback import RollbackDecision, check_rollback
from controller.core.sizes import addresses_problem


class ReplicaRegistry:
    """Mixin of ControllerState: everything about replicas and rounds."""

    # -- joining a round ---------------------------------------------------------------

    def join(self, req: JoinRequest, now: float) -> None:
        rid, r, ftar, state, restarted = self._checked_join(req)
        # Validated: from here on the request changes state.
        if r is None:
            r = self.replicas[rid] = Replica(replica_id=rid, incarnation=req.incarnation, step=req.step)
            self._live = None
            self._event(now, "replica", rid, f"replica {rid} registered at step {req.step}")
        elif restarted and r.state == ReplicaState.FINISHED:
            self.lifecycle.trains_again(rid)
            self._transition(r, ReplicaState.JOINING, f"trains again after it finished (incarnation "
                                                      f"{r.incarnation} → {req.incarnation})", now)
        elif restarted and r.state != ReplicaState.DEAD:
            self.kill_replica(rid, DeathCause.RESTARTED,
                              f"its leader restarted (incarnation {r.incarnation} → {req.incarnation})", now)
        if restarted:  # a restarted replica may resume from an older checkpoint
            r.committed_step = min(r.committed_step, req.step - 1)
        if r.state == ReplicaState.DEAD:
            self._transition(r, ReplicaState.JOINING, f"rejoined at step {req.step}", now)
        r.incarnation = req.incarnation or r.incarnation
        r.step = req.step
        r.world_size = req.world_size
        r.last_seen = now
        if ftar and ftar != r.ftar_addresses:
            r.ftar_addresses = ftar
            self.writes.mark(addresses_section(rid))
            self.round_renewed.add(rid)
        if state and state != r.state_addresses:
            r.state_addresses = state
            self.writes.mark(addresses_section(rid))
            self.round_renewed.add(rid)
        if restarted:
            self.round_renewed.add(rid)
        r.coordinator_address = req.coordinator_address or r.coordinator_address
        self.suspects.cleared(rid)  # its leader is back
        if not self.round_joined:
            self.round_first_join_at = now
        self.round_joined[rid] = req.step
        self.goodput.on_join(rid, now)

    def _checked_join(self, req: JoinRequest):
        """A join's fields and its right to join checked (RequestError says why not); returns
        the replica id, its record (None: new), its addresses and whether it restarted."""
        s = self.settings
        rid = check_id("replica_id", req.replica_id, s.max_id_chars)
        check_non_negative("step", req.step)
        if not 1 <= req.world_size <= s.max_world_size:
            raise InvalidArgument(f"world_size must be 1..{s.max_world_size}, got {req.world_size}.")
        ftar = check_addresses("ftar_addresses", req.ftar_addresses, req.world_size, s.max_address_chars)
        state = check_addresses("state_addresses", req.state_addresses, req.world_size, s.max_address_chars)
        if req.coordinator_address:  # named as the wire names it
            check_address("leader_address", req.coordinator_address, s.max_address_chars)
        check_optional_id("incarnation", req.incarnation, s.max_id_chars)
        self._check_coordinator_host(rid, req.host_id)
        r = self.replicas.get(rid)
        if (ftar or state) and (r is None or ftar != r.ftar_addresses or state != r.state_addresses):
            new = (ftar or (r.ftar_addresses if r else ()), state or (r.state_addresses if r else ()))
            problem = addresses_problem(rid, self.addresses_snapshot(*new), s)
            if problem:
                raise InvalidArgument(problem)
        if r is None and len(self.replicas) >= s.max_replica_records:
            raise FailedPrecondition(
                f"replica {rid!r} is one too many: the job is configured for {s.replicas} replicas."
            )
        restarted = r is not None and bool(r.incarnation) and req.incarnation != r.incarnation
        self.lifecycle.check_join_allowed(rid, r, restarted)
        self._check_replica_set(rid, req.world_size)
        member = self.quorum is not None and any(m.replica_id == rid for m in self.quorum.members)
        beyond = step_problem(rid, req.step, self.quorum.max_step if self.quorum else None, self.max_committed_step,
                              member)
        if beyond:
            raise FailedPrecondition(beyond)
        if (r is not None and not restarted and r.state != ReplicaState.DEAD
                and req.step < r.step and not r.failed_commit):
            raise FailedPrecondition(
                f"replica {rid} asked to train step {req.step}, but it already committed step "
                f"{r.committed_step}; a step may go back only after a failed-commit report."
            )
        return rid, r, ftar, state, restarted

    def try_close_round(self, now: float) -> Quorum | None:
        """Close the round if the policy says so; returns the new quorum or None."""
        if self.lifecycle.job_over:  # final: no quorum forms after it
            self.round_reason, self.round_wake_at = f"the job is {self.lifecycle.job_state.value}", None
            return None
        decided = self._decide_round(now)
        if decided is None:
            return None
        return self._form_quorum(*decided, now)

    def _decide_round(self, now: float) -> tuple[dict[str, int], RollbackDecision | None, str] | None:
        """The quorum policy and the rollback rule on the open round: the members (with their
        steps), the rollback (None: none) and the reason; None while the round stays open."""
        s = self.settings
        previous = self.quorum.member_ids if self.quorum else frozenset()
        view = RoundView(
            joined=dict(self.round_joined),
            first_join_at=self.round_first_join_at,
            live=self.live_replicas(),
            previous=previous,
            unregistered=max(s.replicas - len(self.replicas), 0),
            dead=self.dead_replicas(),
            suspect=self.suspects.ids() & self.live_replicas() if self.suspects.since else frozenset(),
            # if the round is quorate now and was not before, it became so now
            quorate_at=_or(quorate_since(self.round_quorate, self.round_first_join_at), now),
        )
        decision = compute_quorum(view, now, min_replicas=s.min_replicas, join_timeout_s=s.join_timeout_s)
        if decision.quorate and quorate_since(self.round_quorate, self.round_first_join_at) is None:
            self.round_quorate = (self.round_first_join_at, now)  # this round's, by its first join
        self.round_reason, self.round_wake_at = decision.reason, decision.wake_at
        if decision.members is None:
            return None
        members = {rid: self.round_joined[rid] for rid in decision.members}
        holders = {r.replica_id: r.committed_step for r in self.replicas.values()
                   if r.replica_id not in members and r.committed_step >= self.history_step
                   and r.state != ReplicaState.FINISHED}  # a finished replica does not come back
        rollback = check_rollback(members, history_step=self.history_step, holders=holders,
                                  newest_checkpoint_step=self.newest_checkpoint_step,
                                  waiting_since=self.rollback_wait_since, now=now, wait_s=s.rollback_wait_s,
                                  alive_until={rid: self.replicas[rid].last_seen + s.heartbeat_timeout_s
                                               for rid in holders if self.replicas[rid].state != ReplicaState.DEAD})
        if rollback is not None and rollback.wait:
            if self.rollback_wait_since is None:
                self._event(now, "rollback_wait", "round", rollback.reason)
                self.rollback_wait_since = now
            self.round_reason, self.round_wake_at = rollback.reason, rollback.wake_at
            return None
        self.rollback_wait_since = None
        reason = clip_text(decision.reason + (f"; {rollback.reason}" if rollback else ""), s.max_reason_chars)
        return members, rollback, reason

    def _form_quorum(self, members: dict[str, int], rollback: RollbackDecision | None, reason: str,
                     now: float) -> Quorum:
        s = self.settings
        previous = self.quorum.member_ids if self.quorum else frozenset()
        self.goodput.on_quorum(members, now)
        diverged = self.divergence.diverged_members(self.replicas, members)
        q = form_quorum(
            members,
            previous_id=self.quorum.quorum_id if self.quorum else self.first_quorum_id - 1,
            previous_members=previous,
            # a failed commit, or a member with a new process or new addresses, needs new rings
            failed_commit=any(self.replicas[rid].failed_commit or rid in self.round_renewed for rid in members),
            must_resync=diverged,
            lr_policy=s.lr_policy,
            total_replicas=s.replicas,
            reason=reason,
            now=now,
        )
        if rollback is not None:
            q = replace(q, resume_checkpoint_step=rollback.resume_checkpoint_step)
        self._switch_history(q, rollback, now)
        self._seat_members(q, diverged, now)
        for r in self.replicas.values():
            if r.state in (ReplicaState.HEALTHY, ReplicaState.BEHIND) and r.replica_id not in members:
                self._transition(r, ReplicaState.JOINING, f"left out of quorum {q.quorum_id}: {q.reason}", now)
        if not self.quorum or q.quorum_id != self.quorum.quorum_id:
            self._event(now, "quorum", str(q.quorum_id),
                        f"quorum {q.quorum_id}: {', '.join(m.replica_id for m in q.members)} at step "
                        f"{q.max_step}, lr_scale {q.lr_scale:.3f} ({q.reason})")
            self.quorum_history.append(q)
            del self.quorum_history[: -s.recent_quorums]
            self.writes.mark(REPLICAS)
        self.quorum = q
        self.round_joined = {}
        self.round_renewed = set()
        self.round_first_join_at = None
        self.round_wake_at = None
        return q

    def _seat_members(self, q: Quorum, diverged: frozenset[str], now: float) -> None:
        """Each member of the new quorum `q` told what it was given, in its new state."""
        for m in q.members:
            r = self.replicas[m.replica_id]
            r.failed_commit = False
            r.history_epoch = self.history_epoch
            # What this replica is told: its commit report must name exactly this. Written down
            # before the answer goes out, so a successor accepts the report too -- unless it
            # follows from what is durable: a fast-path answer (the same quorum id, the step
            # after the committed one), which _check_given accepts after a takeover. So the
            # quorum path writes nothing while the quorum id holds.
            derivable = q.quorum_id == r.given_quorum_id and q.max_step == r.committed_step + 1
            r.given_quorum_id, r.given_step, r.given_restored = q.quorum_id, q.max_step, False
            if not derivable:
                self.writes.mark(REPLICAS)
            if m.healthy:
                self._transition(r, ReplicaState.HEALTHY, f"in quorum {q.quorum_id}" + (
                    f": no member holds the reference state, so training goes on from {r.replica_id}'s state"
                    if r.replica_id in diverged else ""), now)
            elif r.replica_id in diverged:
                self._transition(r, ReplicaState.DIVERGED,
                                 f"re-syncing in quorum {q.quorum_id} from "
                                 f"{', '.join(q.recover.get(m.replica_id, ()))}: its digest diverged", now)
            else:
                self._transition(r, ReplicaState.BEHIND,
                                 f"in quorum {q.quorum_id} at step {m.step}, behind max step {q.max_step}; "
                                 f"recovering from {', '.join(q.recover.get(m.replica_id, ()))}", now)

    def _switch_history(self, q: Quorum, rollback: RollbackDecision | None, now: float) -> None:
        """A rollback starts a new history below the newest committed step; a member that
        brings a step past the history's newest (a replica back from an older history) rolls
        it forward, abandoning what was committed since the rollback. Both are loud: an event
        with both steps, and the steps counted in `steps_lost`."""
        newest = q.max_step - 1
        on_branch = [rid for rid, r in self.replicas.items() if r.history_epoch == self.history_epoch]
        if rollback is not None:
            # The history continues from what the members hold; if they load the offered
            # checkpoint instead, their first report moves it up to there.
            self._lose("rollback", rollback.steps_lost)
            self._event(now, "rollback", str(q.quorum_id),
                        f"quorum {q.quorum_id} rolls back: the job had committed step {self.history_step}, "
                        f"training resumes at step {q.max_step} ({rollback.steps_lost} committed steps lost"
                        + (f"; from the checkpoint of step {q.resume_checkpoint_step}"
                           if q.resume_checkpoint_step is not None else "") + ")", "rollback")
            self.goodput.on_abandoned(on_branch, q.max_step)  # what they committed past it
            self.history_step, self.branch_start_step = newest, q.max_step
            kind = "rollback"
        elif newest > self.history_step and any(
                self.replicas[m.replica_id].history_epoch != self.history_epoch for m in q.members if m.healthy):
            abandoned = max(self.history_step - self.branch_start_step + 1, 0) if self.branch_start_step >= 0 else 0
            back = sorted(m.replica_id for m in q.members if m.healthy)
            self._lose("abandoned", abandoned)
            if self.branch_start_step >= 0:  # the branch since the rollback, as its committers trained it
                self.goodput.on_abandoned(on_branch, self.branch_start_step)
            self._event(now, "roll_forward", str(q.quorum_id),
                        f"quorum {q.quorum_id} rolls forward from step {self.history_step} to step {newest}: "
                        f"{', '.join(back)} came back with it; {abandoned} steps committed since the rollback "
                        f"are abandoned", "roll_forward")
            self.history_step, self.branch_start_step = newest, -1
            kind = "roll_forward"
        else:
            return
        self.history_changes[kind] = self.history_changes.get(kind, 0) + 1
        self.history_epoch += 1
        self.writes.mark(REPLICAS)

    def _lose(self, kind: str, steps: int) -> None:
        self.steps_lost[kind] = self.steps_lost.get(kind, 0) + max(steps, 0)

    # -- reports ---------------------------------------------------------------------------

    def _known_replica(self, replica_id: str) -> Replica:
        check_id("replica_id", replica_id, self.settings.max_id_chars)
        r = self.replicas.get(replica_id)
        if r is None:
            raise FailedPrecondition(f"replica {replica_id!r} is unknown: it must join a quorum first.")
        return r

    def _check_coordinator_host(self, replica_id: str, host_id: str) -> None:
        """Fencing: only the host that holds rank 0 of a replica may run its coordinator, and
        the coordinator of a replica with a known rank-0 holder must say which host it runs on."""
        check_optional_id("host_id", host_id, self.settings.max_id_chars)
        holder = self.host_registry.rank_holders.get((replica_id, 0))
        if holder is None or holder == host_id:
            return
        if not host_id:
            raise FailedPrecondition(
                f"replica {replica_id}'s leader named no host_id, but host {holder} holds its rank 0: "
                f"a leader must name its host (FTHSDP_HOST_ID).")
        raise FailedPrecondition(
            f"host {host_id} does not hold rank 0 of replica {replica_id} (host {holder} does): "
            f"a trainer left on a replaced host must stop.")

    def _check_given(self, r: Replica, quorum_id: int, step: int, what: str) -> None:
        """A report about a step must name the quorum and step this replica was last given."""
        check_non_negative("quorum_id", quorum_id)
        check_non_negative("step", step)
        if (r.given_restored and quorum_id == r.given_quorum_id and r.given_step <= r.committed_step
                and step == r.committed_step + 1):
            return  # a fast-path answer the previous leader gave without writing it down
        if (quorum_id, step) != (r.given_quorum_id, r.given_step):
            given = (f"its last quorum answer was quorum {r.given_quorum_id} at step {r.given_step}"
                     if r.given_step >= 0 else "it has had no quorum answer yet")
            raise FailedPrecondition(
                f"replica {r.replica_id} reported {what} step {step} in quorum {quorum_id}, but {given}; "
                f"a report must name exactly the quorum and step it was given.")

    def report_step(self, replica_id: str, step: int, now: float, *, quorum_id: int, loss: float | None = None,
                    step_time_s: float | None = None, tokens: int = 0, host_id: str = "",
                    digest: str = "", caught_up: bool = False, checkpoint_step: int | None = None,
                    rank_digests: tuple[str, ...] = ()) -> None:
        r = self._known_replica(replica_id)
        digest = check_digest(digest, self.settings.max_digest_chars)
        rank_digests = check_rank_digests(rank_digests, r.world_size)
        if rank_digests and not digest:
            raise InvalidArgument("rank_digests were sent without the replica digest they belong to.")
        self._check_coordinator_host(replica_id, host_id)
        check_non_negative("tokens", tokens)
        if checkpoint_step is not None and not 0 <= checkpoint_step <= step:
            raise InvalidArgument(f"checkpoint_step must be between 0 and the committed step {step}, "
                                  f"got {checkpoint_step}.")
        if loss is not None:
            check_finite("loss", loss)
        if step_time_s is not None:
            check_finite("step_time_s", step_time_s, non_negative=True)
        self._check_given(r, quorum_id, step, "a commit of")
        if step == r.committed_step:
            return  # the same report again (a retry whose first answer was lost): counted once
        trained = r.state == ReplicaState.HEALTHY and not caught_up  # a catch-up step trains nothing
        self.goodput.on_commit(replica_id, step, step_time_s, trained, now)
        r.committed_step = step
        self.max_committed_step = max(self.max_committed_step, step)
        if r.history_epoch == self.history_epoch:  # a commit on an older history extends nothing
            self.history_step = max(self.history_step, step)
            if checkpoint_step is not None:
                self.newest_checkpoint_step = max(self.newest_checkpoint_step, checkpoint_step)
        r.step = step + 1
        r.last_seen = now
        r.last_loss, r.last_step_time_s = loss, step_time_s
        r.tokens += tokens
        self.steps_committed += 1
        self.writes.mark(REPLICAS)
        if r.state == ReplicaState.BEHIND and self.quorum and step >= self.quorum.max_step:
            self._transition(r, ReplicaState.HEALTHY, f"caught up and committed step {step}", now)
        if digest:
            self.diagnostician.keep_rank_digests(replica_id, step, rank_digests, tuple(
                self.host_registry.rank_holders.get((replica_id, k)) for k in range(r.world_size)))
        self._record_digest(r, step, digest, caught_up, now)

    def report_commit_failed(self, replica_id: str, step: int, reason: str, now: float, *, quorum_id: int,
                             host_id: str = "") -> None:
        r = self._known_replica(replica_id)
        self._check_coordinator_host(replica_id, host_id)
        self._check_given(r, quorum_id, step, "a failed commit of")
        reason = clip_text(reason, self.settings.max_reason_chars)
        r.failed_commit = True
        r.last_seen = now
        self.writes.mark(REPLICAS)  # the retry it allows (a new quorum id) must survive a failover
        self._event(now, "commit_failed", replica_id,
                    f"replica {replica_id} failed to commit step {step}: {reason or 'no reason given'}")

    def report_finished(self, replica_id: str, step: int, now: float, *, reason: str = "",
                        host_id: str = "") -> JobState:
        """Its leader says the replica trained to the end: FINISHED (controller.core.finishing)."""
        r = self._known_replica(replica_id)
        self._check_coordinator_host(replica_id, host_id)
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
            return self.lifecycle.job_state  # said again (a retried call): nothing new
        if step > r.committed_step:  # its last step report was lost: the replica knows best
            r.committed_step, r.step = step, step + 1
            self.max_committed_step = max(self.max_committed_step, step)
        self.round_joined.pop(replica_id, None)
        if not self.round_joined:
            self.round_first_join_at = None
        self._transition(r, ReplicaState.FINISHED,
                         f"finished after step {step}" + (f": {clip_text(reason, 200)}" if reason else ""), now)
        return self.lifecycle.job_state

    def report_replica_dead(self, replica_id: str, reason: str, now: float, *, host_id: str = "") -> None:
        self._known_replica(replica_id)
        self._check_coordinator_host(replica_id, host_id)
        reason = clip_text(reason, self.settings.max_reason_chars)
        self.kill_replica(replica_id, DeathCause.REPORTED, reason or "reported dead", now)

    # -- liveness ----------------------------------------------------------------------------

    def kill_replica(self, replica_id: str, cause: DeathCause, reason: str, now: float) -> bool:
        r = self.replicas.get(replica_id)
        # A finished replica's work is done: only a new incarnation takes it out of FINISHED.
        if r is None or r.state in SETTLED:
            return False
        self._transition(r, ReplicaState.DEAD, reason, now, cause=cause.value)
        self.deaths[cause.value] = self.deaths.get(cause.value, 0) + 1
        self.diagnostician.forget_replica(replica_id, now)  # its groups form anew when it returns
        self.round_joined.pop(replica_id, None)
        if not self.round_joined:
            self.round_first_join_at = None
        return True

    def leave_round(self, replica_id: str, why: str, now: float) -> bool:
        """A joiner whose leader is gone (its call ended unanswered) leaves the open round at
        once: no quorum may count it. Its state is left alone (a leader that gave up waiting
        joins again). Returns whether it had joined."""
        if replica_id not in self.round_joined:
            return False
        del self.round_joined[replica_id]
        if not self.round_joined:
            self.round_first_join_at = None
        self._event(now, "replica", replica_id, f"replica {replica_id} left the open round: {why}")
        return True

    def _check_replica_set(self, rid: str, world_size: int) -> None:
        """Refuse a join outside the replicas the hosts hold (controller.core.replica_set)."""
        holder = self.host_registry.hosts.get(self.host_registry.rank_holders.get((rid, 0), ""))
        held = holder.assignment.world_size if holder is not None and holder.assignment is not None else None
        if held == world_size or (held is None and (not self.host_registry.rank_holders or rid in self.replicas)):
            return
        held_ids = {r for (r, k) in self.host_registry.rank_holders if k == 0}
        if held is None and len(held_ids | set(self.replicas)) < self.settings.replicas:
            return  # room left in the configured count: a replica without agents (torchrun) may join
        problem = join_problem(rid, world_size, held, held_ids)
        if problem:
            raise FailedPrecondition(problem)

    def coordinator_connection_lost(self, replica_id: str, how: str, now: float) -> bool:
        """A coordinator's connection (`how`: which) closed without goodbye: its replica is suspect
        (controller.core.suspects) while it is live. Returns whether it became suspect."""
        r = self.replicas.get(replica_id)
        if r is None or r.state in SETTLED or not self.suspects.lost(replica_id, now):
            return False
        self._event(now, "suspect", replica_id,
                    f"replica {replica_id} is suspect: {how} closed without goodbye; rounds do not wait for it "
                    f"until it joins again or a heartbeat proves it alive")
        return True

    def expire_replicas(self, now: float) -> None:
        for r in list(self.replicas.values()):
            if r.state not in SETTLED:
                why = self.silence(r.last_seen, now)
                if why:
                    self.kill_replica(r.replica_id, DeathCause.HEARTBEAT, f"no heartbeat {why}", now)

    def live_replicas(self) -> frozenset[str]:
        """The replicas a round waits for: every one not DEAD or FINISHED. Kept until a replica
        registers or changes state (it is asked on every join)."""
        return self._liveness()[0]

    def dead_replicas(self) -> frozenset[str]:
        """The replicas that are DEAD, kept like live_replicas()."""
        return self._liveness()[1]

    def _liveness(self) -> tuple[frozenset[str], frozenset[str]]:
        if self._live is None:
            rs = self.replicas.values()
            self._live = (frozenset(r.replica_id for r in rs if r.state not in SETTLED),
                          frozenset(r.replica_id for r in rs if r.state == ReplicaState.DEAD))
        return self._live

    def _transition(self, r: Replica, state: ReplicaState, reason: str, now: float, cause: str = "") -> None:
        reason = clip_text(reason, self.settings.max_reason_chars)
        if r.state == state and r.reason == reason:
            return
        changed = r.state != state
        r.state, r.reason = state, reason
        if state in (ReplicaState.DIVERGED, ReplicaState.HEALTHY):
            r.must_resync = state == ReplicaState.DIVERGED  # cleared only by becoming HEALTHY
        self._live = None
        self.writes.mark(REPLICAS)
        if changed:
            self._event(now, "death" if state == ReplicaState.DEAD else "replica", r.replica_id,
                        f"replica {r.replica_id} became {state.value}: {reason}", cause)
            self.goodput.on_state(r.replica_id, state == ReplicaState.HEALTHY, state == ReplicaState.DEAD,
                                  cause, r.last_seen, now)
            if state in SETTLED:
                self.act(self.lifecycle.replica_settled(self.replicas, now), now)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
