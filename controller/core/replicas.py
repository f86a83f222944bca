"""Replica registry: the replica records, their states, liveness and suspects. A component. Time passed in.

`transition` is the one place a replica's state changes: the lifecycle is drawn in
controller.core.model.ReplicaState, and every move is checked against REPLICA_MOVES.

It owns the records (and the deaths counted, the suspects) and changes nothing else: the
open round and the quorum are the rounds' (controller.core.rounds), who may act for a replica
is the hosts' (controller.core.admission checks it), and the job's ending is the lifecycle's.
What it needs of the rest comes in at construction: the pending writes, `announce` (an event),
the goodput tracker it reports state changes to, and `settled(record, now)`, called whenever a
replica becomes DEAD or FINISHED (ControllerState then takes it out of the round and asks the
lifecycle whether the job completed).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from controller.core.checks import (
    check_address, check_addresses, check_finite, check_id, check_int_range, check_non_negative, check_optional_id,
    clip_text,
)
from controller.core.diagnosis.sdc import check_rank_digests
from controller.core.digests import check_digest
from controller.core.intents import KillReplica
from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.model import (
    NO_CHECKPOINT, REPLICA_MOVES, SETTLED, DeathCause, JoinRequest, Quorum, Replica, ReplicaState, check_move,
    refresh_seen,
)
from controller.core.pending_writes import REPLICAS, PendingWrites, addresses_section
from controller.core.sizes import addresses_problem
from controller.core.snapshots import addresses_snapshot
from controller.core.suspects import Suspects
from controller.settings import ControllerSettings


#: The wire's int32 limit.
MAX_CHECKPOINT_EVERY_STEPS = 2**31 - 1


class JoinPlan(NamedTuple):  # a tuple: made on every join, cheaper than a frozen dataclass
    """A join that passed the registry's checks: its replica, record (None: new), addresses
    (empty: unchanged) and whether it comes from a new process (a new incarnation)."""

    replica_id: str
    record: Replica | None
    ftar: tuple[str, ...]
    state: tuple[str, ...]
    restarted: bool


class ReplicaRegistry:
    """Everything about replica records. `announce(now, kind, subject, message, cause="")`
    records an event. A replica that becomes DEAD or FINISHED has *settled*: the methods that
    settle one say so in what they return (`kill`, `expire`, `finish`, `transition`), and the
    core carries out what follows (ControllerState._replica_settled)."""

    def __init__(self, settings: ControllerSettings, writes: PendingWrites, announce: Callable[..., None],
                 goodput) -> None:
        self.settings = settings
        self._writes, self._announce, self._goodput = writes, announce, goodput
        self.replicas: dict[str, Replica] = {}
        #: (live, dead) replica ids, until a replica registers or changes state (None: to be computed)
        self._live: tuple[frozenset[str], frozenset[str]] | None = None
        self.deaths: dict[str, int] = {}
        #: replicas whose coordinator's connection closed without goodbye (controller.core.suspects)
        self.suspects = Suspects()
        #: whether this controller said that the job writes no durable checkpoint (once)
        self.told_no_checkpoint = False

    # -- joins -------------------------------------------------------------------------------

    def check_join_fields(self, req: JoinRequest) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """A join's own fields (RequestError says which is wrong): its replica id and addresses."""
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
        check_int_range("checkpoint_every_steps", req.checkpoint_every_steps, 0, MAX_CHECKPOINT_EVERY_STEPS)
        return rid, ftar, state

    def check_room(self, rid: str, req: JoinRequest, ftar: tuple[str, ...], state: tuple[str, ...]) -> JoinPlan:
        """Whether the join fits what one record may hold and the records the job may have."""
        s = self.settings
        r = self.replicas.get(rid)
        if (ftar or state) and (r is None or ftar != r.ftar_addresses or state != r.state_addresses):
            new = (ftar or (r.ftar_addresses if r else ()), state or (r.state_addresses if r else ()))
            problem = addresses_problem(rid, addresses_snapshot(*new), s)
            if problem:
                raise InvalidArgument(problem)
        if r is None and len(self.replicas) >= s.max_replica_records:
            raise FailedPrecondition(
                f"replica {rid!r} is one too many: the job is configured for {s.replicas} replicas."
            )
        restarted = r is not None and bool(r.incarnation) and req.incarnation != r.incarnation
        return JoinPlan(rid, r, ftar, state, restarted)

    @staticmethod
    def check_goes_back(plan: JoinPlan, step: int) -> None:
        """A live replica's step goes back only after a failed commit (or with a new process)."""
        r = plan.record
        if (r is not None and not plan.restarted and r.state != ReplicaState.DEAD
                and step < r.step and not r.failed_commit):
            raise FailedPrecondition(
                f"replica {plan.replica_id} asked to train step {step}, but it already committed step "
                f"{r.committed_step}; a step may go back only after a failed-commit report."
            )

    def admit(self, plan: JoinPlan, req: JoinRequest, now: float, job_over: bool = False) -> bool:
        """The checked join changes the record (a restarted replica's old process is dead
        already: `restart_kills`). Returns whether the replica joins renewed (a new process or
        new addresses: the quorum id must change). A replica whose old process's death ended
        the job (`job_over` after it) stays DEAD: it does not rejoin a COMPLETED job."""
        rid, r = plan.replica_id, plan.record
        if r is None:
            r = self.replicas[rid] = Replica(replica_id=rid, incarnation=req.incarnation, step=req.step)
            self._live = None
            self._announce(now, "replica", rid, f"replica {rid} registered at step {req.step}")
        elif plan.restarted and r.state == ReplicaState.FINISHED:
            self.transition(r, ReplicaState.JOINING, f"trains again after it finished (incarnation "
                                                     f"{r.incarnation} → {req.incarnation})", now)
        if plan.restarted:  # a restarted replica may resume from an older checkpoint
            r.committed_step = min(r.committed_step, req.step - 1)
        if r.state == ReplicaState.DEAD and not job_over:
            self.transition(r, ReplicaState.JOINING, f"rejoined at step {req.step}", now)
        r.incarnation = req.incarnation or r.incarnation
        r.step = req.step
        r.world_size = req.world_size
        r.last_seen = now
        renewed = plan.restarted
        for name, new in (("ftar_addresses", plan.ftar), ("state_addresses", plan.state)):
            if new and new != getattr(r, name):
                setattr(r, name, new)
                self._writes.mark(addresses_section(rid))
                renewed = True
        r.coordinator_address = req.coordinator_address or r.coordinator_address
        if r.checkpoint_every_steps != req.checkpoint_every_steps:
            r.checkpoint_every_steps = req.checkpoint_every_steps
            self._writes.mark(REPLICAS)
        self.suspects.cleared(rid)  # its coordinator is back
        if self.durable_checkpoint() is False and not self.told_no_checkpoint:
            self.told_no_checkpoint = True
            self._announce(now, "no_checkpoint", rid, f"replica {rid} writes no durable checkpoint, and no replica "
                                                      f"of the job does: {NO_CHECKPOINT}")
        return renewed

    @staticmethod
    def restart_kills(plan: JoinPlan, req: JoinRequest) -> KillReplica | None:
        """A join from a new process of a replica that is neither DEAD nor FINISHED: its old
        process is dead (the core carries it out before `admit`)."""
        r = plan.record
        if r is None or not plan.restarted or r.state in SETTLED:
            return None
        return KillReplica(plan.replica_id, DeathCause.RESTARTED,
                           f"its coordinator restarted (incarnation {r.incarnation} → {req.incarnation})")

    def durable_checkpoint(self) -> bool | None:
        """Whether a replica of the job writes durable checkpoints (None: none joined yet). The
        job can resume from one only if some replica writes them (a rollback offers the newest
        any replica reported)."""
        if not self.replicas:
            return None
        return any(r.checkpoint_every_steps > 0 for r in self.replicas.values())

    # -- seats in a new quorum ---------------------------------------------------------------

    def seat(self, q: Quorum, diverged: frozenset[str], history_epoch: int, now: float) -> None:
        """Each member of the new quorum `q` told what it was given, in its new state; a
        HEALTHY or BEHIND replica left out of it goes back to JOINING."""
        for m in q.members:
            r = self.replicas[m.replica_id]
            r.failed_commit = False
            r.history_epoch = history_epoch
            # What this replica is told: its commit report must name exactly this. Written down
            # before the answer goes out, so a successor accepts the report too -- unless it
            # follows from what is durable: a fast-path answer (the same quorum id, the step
            # after the committed one), which check_given accepts after a takeover. So the
            # quorum path writes nothing while the quorum id holds.
            derivable = q.quorum_id == r.given_quorum_id and q.max_step == r.committed_step + 1
            r.given_quorum_id, r.given_step, r.given_restored = q.quorum_id, q.max_step, False
            if not derivable:
                self._writes.mark(REPLICAS)
            sources = ", ".join(q.recover.get(m.replica_id, ()))
            if m.healthy:
                self.transition(r, ReplicaState.HEALTHY, f"in quorum {q.quorum_id}" + (
                    f": no member holds the reference state, so training goes on from {r.replica_id}'s state"
                    if r.replica_id in diverged else ""), now)
            elif r.replica_id in diverged:
                self.transition(r, ReplicaState.DIVERGED,
                                f"re-syncing in quorum {q.quorum_id} from {sources}: its digest diverged", now)
            else:
                self.transition(r, ReplicaState.BEHIND, f"in quorum {q.quorum_id} at step {m.step}, behind max "
                                                        f"step {q.max_step}; recovering from {sources}", now)
        members = q.member_ids
        for r in self.replicas.values():
            if r.state in (ReplicaState.HEALTHY, ReplicaState.BEHIND) and r.replica_id not in members:
                self.transition(r, ReplicaState.JOINING, f"left out of quorum {q.quorum_id}: {q.reason}", now)

    # -- reports -----------------------------------------------------------------------------

    def known(self, replica_id: str) -> Replica:
        check_id("replica_id", replica_id, self.settings.max_id_chars)
        r = self.replicas.get(replica_id)
        if r is None:
            raise FailedPrecondition(f"replica {replica_id!r} is unknown: it must join a quorum first.")
        return r

    @staticmethod
    def check_given(r: Replica, quorum_id: int, step: int, what: str) -> None:
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

    def check_commit(self, r: Replica, step: int, *, digest: str, rank_digests: tuple[str, ...], tokens: int,
                     checkpoint_step: int | None, loss: float | None,
                     step_time_s: float | None) -> tuple[str, tuple[str, ...]]:
        """A commit report's fields (RequestError says which is wrong): its digests, checked."""
        digest = check_digest(digest, self.settings.max_digest_chars)
        rank_digests = check_rank_digests(rank_digests, r.world_size)
        if rank_digests and not digest:
            raise InvalidArgument("rank_digests were sent without the replica digest they belong to.")
        check_non_negative("tokens", tokens)
        if checkpoint_step is not None and not 0 <= checkpoint_step <= step:
            raise InvalidArgument(f"checkpoint_step must be between 0 and the committed step {step}, "
                                  f"got {checkpoint_step}.")
        if loss is not None:
            check_finite("loss", loss)
        if step_time_s is not None:
            check_finite("step_time_s", step_time_s, non_negative=True)
        return digest, rank_digests

    def commit(self, r: Replica, step: int, now: float, *, loss: float | None, step_time_s: float | None,
               tokens: int, caught_up: bool) -> None:
        """`r` committed `step` (checked, not a repeat)."""
        trained = r.state == ReplicaState.HEALTHY and not caught_up  # a catch-up step trains nothing
        self._goodput.on_commit(r.replica_id, step, step_time_s, trained, now)
        r.committed_step = step
        r.step = step + 1
        r.last_seen = now
        r.last_loss, r.last_step_time_s = loss, step_time_s
        r.tokens += tokens
        self._writes.mark(REPLICAS)

    def keep_digest(self, r: Replica, step: int, digest: str) -> None:
        if digest:
            r.digest, r.digest_step = digest, step

    def commit_failed(self, r: Replica, step: int, reason: str, now: float) -> None:
        reason = clip_text(reason, self.settings.max_reason_chars)
        r.failed_commit = True
        r.last_seen = now
        self._writes.mark(REPLICAS)  # the retry it allows (a new quorum id) must survive a failover
        self._announce(now, "commit_failed", r.replica_id,
                       f"replica {r.replica_id} failed to commit step {step}: {reason or 'no reason given'}")

    @staticmethod
    def check_finished(r: Replica, step: int) -> None:
        if step < -1:
            raise InvalidArgument(f"step must be -1 (nothing committed) or more, got {step}.")
        if step > max(r.given_step, r.committed_step):
            raise FailedPrecondition(
                f"replica {r.replica_id} reports it finished at step {step}, but no quorum gave it a step after "
                f"{max(r.given_step, r.committed_step)}; a replica cannot have committed a step it was not given.")
        if step < r.committed_step and r.state != ReplicaState.FINISHED:
            raise FailedPrecondition(
                f"replica {r.replica_id} reports it finished at step {step}, but it already committed step "
                f"{r.committed_step}; steps never go backwards.")

    def finish(self, r: Replica, step: int, reason: str, now: float) -> bool:
        """Its coordinator says `r` trained to the end (checked): FINISHED. False if it already was
        (a retried call). Its last step report may have been lost: the replica knows best."""
        r.last_seen = now
        if r.state == ReplicaState.FINISHED:
            return False
        if step > r.committed_step:
            r.committed_step, r.step = step, step + 1
        reason = clip_text(reason, self.settings.max_reason_chars)
        self.transition(r, ReplicaState.FINISHED,
                        f"finished after step {step}" + (f": {clip_text(reason, 200)}" if reason else ""), now)
        return True

    def count_restart(self, replica_id: str) -> None:
        """The controller restarted the replica's ranks together on its hosts."""
        r = self.replicas.get(replica_id)
        if r is not None:
            r.restarts += 1
            self._writes.mark(REPLICAS)

    # -- liveness ----------------------------------------------------------------------------

    def kill(self, replica_id: str, cause: DeathCause, reason: str, now: float) -> bool:
        """`replica_id` is DEAD for `cause`; returns whether it died now (it settled)."""
        r = self.replicas.get(replica_id)
        # A finished replica's work is done: only a new incarnation takes it out of FINISHED.
        if r is None or r.state in SETTLED:
            return False
        self.transition(r, ReplicaState.DEAD, reason, now, cause=cause.value)
        self.deaths[cause.value] = self.deaths.get(cause.value, 0) + 1
        return True

    def expire(self, now: float, silence: Callable[[float, float], str]) -> list[str]:
        """Declare dead every live replica silent past what `silence(last_seen, now)` allows;
        returns those that died."""
        died = []
        for r in list(self.replicas.values()):
            if r.state not in SETTLED:
                why = silence(r.last_seen, now)
                if why and self.kill(r.replica_id, DeathCause.HEARTBEAT, f"no heartbeat {why}", now):
                    died.append(r.replica_id)
        return died

    def connection_lost(self, replica_id: str, how: str, now: float) -> bool:
        """A coordinator's connection (`how`: which) closed without goodbye: its replica is suspect
        (controller.core.suspects) while it is live. Returns whether it became suspect."""
        r = self.replicas.get(replica_id)
        if r is None or r.state in SETTLED or not self.suspects.lost(replica_id, now):
            return False
        self._announce(now, "suspect", replica_id,
                       f"replica {replica_id} is suspect: {how} closed without goodbye; rounds do not wait for it "
                       f"until it joins again or a heartbeat proves it alive")
        return True

    def beat(self, replica_ids, now: float) -> list[str]:
        """Heartbeats of replicas' coordinators; returns the ids unknown or DEAD (they must join again)."""
        if self.suspects.since:
            for rid in replica_ids:
                self.heard(rid, "its coordinator's heartbeat", now)
        return refresh_seen(self.replicas, replica_ids, ReplicaState.DEAD, now)

    def heard(self, replica_id: str, what: str, now: float) -> None:
        """`what` (a heartbeat) proves `replica_id` alive: it is no longer suspect."""
        if self.suspects.heard(replica_id, now):
            self._announce(now, "replica", replica_id,
                           f"replica {replica_id} is no longer suspect: {what} proves it alive")

    def live(self) -> frozenset[str]:
        """The replicas a round waits for: every one not DEAD or FINISHED. Kept until a replica
        registers or changes state (it is asked on every join)."""
        return self._liveness()[0]

    def dead(self) -> frozenset[str]:
        """The replicas that are DEAD, kept like live()."""
        return self._liveness()[1]

    def _liveness(self) -> tuple[frozenset[str], frozenset[str]]:
        if self._live is None:
            rs = self.replicas.values()
            self._live = (frozenset(r.replica_id for r in rs if r.state not in SETTLED),
                          frozenset(r.replica_id for r in rs if r.state == ReplicaState.DEAD))
        return self._live

    def transition(self, r: Replica, state: ReplicaState, reason: str, now: float, cause: str = "") -> bool:
        """Move `r` to `state` (checked against its table), for `reason`; returns whether it
        settled now (became DEAD or FINISHED)."""
        check_move(REPLICA_MOVES, f"replica {r.replica_id}", r.state, state)
        reason = clip_text(reason, self.settings.max_reason_chars)
        if r.state == state and r.reason == reason:
            return False
        changed = r.state != state
        r.state, r.reason = state, reason
        if state in (ReplicaState.DIVERGED, ReplicaState.HEALTHY):
            r.must_resync = state == ReplicaState.DIVERGED  # cleared only by becoming HEALTHY
        self._live = None
        self._writes.mark(REPLICAS)
        if changed:
            self._announce(now, "death" if state == ReplicaState.DEAD else "replica", r.replica_id,
                           f"replica {r.replica_id} became {state.value}: {reason}", cause)
            self._goodput.on_state(r.replica_id, state == ReplicaState.HEALTHY, state == ReplicaState.DEAD,
                                   cause, r.last_seen, now)
        return changed and state in SETTLED

    # -- durable snapshot --------------------------------------------------------------------

    def restore(self, records: list[dict], deaths: dict, addresses: dict[str, dict] | None, now: float) -> None:
        """The records a previous leader wrote; everyone's silence counts from `now`."""
        self.replicas = {}
        for d in records:
            # a record written before the coordinator's address had its name
            d = {("coordinator_address" if k == "leader_address" else k): v for k, v in d.items()}
            a = (addresses or {}).get(d["replica_id"]) or {"ftar": (), "state": ()}
            self.replicas[d["replica_id"]] = Replica(
                **dict(d, state=ReplicaState(d["state"]), ftar_addresses=tuple(a["ftar"]),
                       state_addresses=tuple(a["state"]), last_seen=now, given_restored=True))
        self.deaths = dict(deaths)
        self._live = None
