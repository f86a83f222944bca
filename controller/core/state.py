"""ControllerState: the whole picture the controller decides on, and its durable snapshot.

Every method takes `now` (seconds) from the caller; nothing here reads a clock, opens a
socket or touches the store. Only `ControllerCore.step` (controller/core/core.py) calls it;
the service and the tests read it through `ControllerView` (controller/core/view.py). A step
leaves what it asks of the shell here for the core to fold into its Ready: the store sections
left unwritten (`writes`, controller/core/pending_writes.py), the orders for agents (`outbox`,
controller/core/outbox.py) and the events (`journal`).

It holds the event journal (controller.core.journal) and combines the components that own
the rest: `replica_registry` (controller.core.replicas: the replica records, liveness,
suspects), `rounds` (controller.core.rounds: the open round, the quorums, the job's history),
`host_registry` (controller.core.hosts: hosts, assignments, versions, the orders they need),
`lifecycle` (controller.core.finishing), `divergence` (controller.core.divergence),
`restart_budget` (controller.core.restarts) and `diagnostician` (controller.core.diagnosis.acting).
A component changes only its own data and returns what it asks of the others as intents
(controller.core.intents: a host's death returns `KillReplica` and `MoveWork`, a replica that
settled says so), which `act` carries out here, in one place and in order. What crosses
components -- a join's checks, closing a round, a commit, a replica that settled -- is combined
here, in the methods of the same names.
"""

from __future__ import annotations

from controller.core.admission import check_coordinator_host, check_join
from controller.core.checks import clip_text
from controller.core.diagnosis.acting import Diagnostician, Facts
from controller.core.diagnosis.telemetry import HostReport
from controller.core.divergence import DivergenceTracker
from controller.core.errors import RequestError
from controller.core.finishing import JobLifecycle
from controller.core.goodput import GoodputTracker, NoGoodput
from controller.core.hosts import HostRegistry
from controller.core.journal import EventJournal
from controller.core.intents import (
    Announce, Diagnose, EndRounds, Evict, KillReplica, MoveReplica, MoveWork, Persist, ReplaceHost, RestartReplica,
)
from controller.core.model import (
    SETTLED, DeathCause, Event, HostState, JobState, JoinRequest, Quorum, Replica, ReplicaState, refresh_seen,
)
from controller.core.outbox import Outbox
from controller.core.pending_writes import JOURNAL, PendingWrites
from controller.core.replicas import ReplicaRegistry
from controller.core.restarts import RestartBudget
from controller.core.rounds import Rounds
from controller.settings import ControllerSettings


class ControllerState:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings.validate()
        #: the recent events, numbered and kept by level (controller.core.journal)
        self.journal = EventJournal()
        self.goodput = (GoodputTracker if settings.telemetry else NoGoodput)(settings.replicas)
        #: silence before this moment is not held against anyone (a takeover's grace)
        self.silence_counted_from = float("-inf")
        #: the store sections changed and not yet handed out for writing (pending_writes.py)
        self.writes = PendingWrites()
        #: replica records, liveness and suspects (controller.core.replicas)
        self.replica_registry = ReplicaRegistry(self.settings, self.writes, self._event, self.goodput)
        #: the open round, the quorums and the job's history (controller.core.rounds)
        self.rounds = Rounds(self.settings, self.writes, self._event, self.goodput)
        #: hosts, their assignments, versions and orders (controller.core.hosts)
        #: the orders for agents not yet handed to the shell (controller.core.outbox)
        self.outbox = Outbox()
        self.host_registry = HostRegistry(self.settings, self.writes, self.outbox, self._event)
        #: each host's replica restarts, against the restart budget (controller.core.restarts)
        self.restart_budget = RestartBudget(self.settings)
        #: replica digests compared per step, DIVERGED replicas (controller.core.divergence)
        self.divergence = DivergenceTracker(self.settings)
        #: the job's ending: COMPLETED or FAILED, when and why (controller.core.finishing)
        self.lifecycle = JobLifecycle(self.settings)
        #: telemetry, findings and what was done about them (controller.core.diagnosis.acting)
        self.diagnostician = Diagnostician(self.settings)

    @property
    def replicas(self) -> dict[str, Replica]:
        return self.replica_registry.replicas

    @property
    def quorum(self) -> Quorum | None:
        return self.rounds.quorum

    # -- joins and rounds (the replica registry and the rounds, with the hosts' fencing) -------

    def join(self, req: JoinRequest, now: float) -> None:
        plan = check_join(req, self.replica_registry, self.host_registry, self.lifecycle, self.rounds, self.settings)
        # Validated: from here on the request changes state.
        if plan.restarted and plan.record is not None and plan.record.state == ReplicaState.FINISHED:
            self.lifecycle.trains_again(plan.replica_id)
        self.act([k for k in [self.replica_registry.restart_kills(plan, req)] if k], now)
        renewed = self.replica_registry.admit(plan, req, now, job_over=self.lifecycle.job_over)
        if self.lifecycle.job_over:
            # Its old process's death (the restart) ended the job: every other replica had
            # finished. The new process trains nothing: its join is refused as the round's end.
            return
        self.rounds.joined(plan.replica_id, req.step, renewed, now)

    def _check_coordinator_host(self, replica_id: str, host_id: str) -> None:
        check_coordinator_host(replica_id, host_id, self.host_registry.rank_holders, self.settings)

    def try_close_round(self, now: float) -> Quorum | None:
        """Close the round if the policy says so; returns the new quorum or None. The rounds
        decide and form it, the replica registry seats its members."""
        rounds, replicas = self.rounds, self.replica_registry
        if self.lifecycle.job_over:  # final: no quorum forms after it
            rounds.end(f"the job is {self.lifecycle.job_state.value}")
            return None
        live = replicas.live()
        suspect = replicas.suspects.ids() & live if replicas.suspects.since else frozenset()
        decided = rounds.decide(self.replicas, live, replicas.dead(), suspect, now)
        if decided is None:
            return None
        diverged = self.divergence.diverged_members(self.replicas, decided[0])
        q = rounds.form(decided, self.replicas, diverged, now)
        replicas.seat(q, diverged, rounds.history_epoch, now)
        rounds.adopt(q, now)
        return q

    def leave_round(self, replica_id: str, why: str, now: float) -> bool:
        """A joiner whose coordinator is gone (its call ended unanswered) leaves the open round at
        once: no quorum may count it. Its state is left alone (a coordinator that gave up waiting
        joins again). Returns whether it had joined."""
        if not self.rounds.leave(replica_id):
            return False
        self._event(now, "replica", replica_id, f"replica {replica_id} left the open round: {why}")
        return True

    # -- coordinators' reports -----------------------------------------------------------------

    def report_step(self, replica_id: str, step: int, now: float, *, quorum_id: int, loss: float | None = None,
                    step_time_s: float | None = None, tokens: int = 0, host_id: str = "",
                    digest: str = "", caught_up: bool = False, checkpoint_step: int | None = None,
                    rank_digests: tuple[str, ...] = ()) -> None:
        replicas = self.replica_registry
        r = replicas.known(replica_id)
        digest, rank_digests = replicas.check_commit(r, step, digest=digest, rank_digests=rank_digests, tokens=tokens,
                                                     checkpoint_step=checkpoint_step, loss=loss,
                                                     step_time_s=step_time_s)
        self._check_coordinator_host(replica_id, host_id)
        replicas.check_given(r, quorum_id, step, "a commit of")
        if step == r.committed_step:
            return  # the same report again (a retry whose first answer was lost): counted once
        replicas.commit(r, step, now, loss=loss, step_time_s=step_time_s, tokens=tokens, caught_up=caught_up)
        self.rounds.committed(step, r.history_epoch, checkpoint_step)
        if r.state == ReplicaState.BEHIND and self.quorum and step >= self.quorum.max_step:
            replicas.transition(r, ReplicaState.HEALTHY, f"caught up and committed step {step}", now)
        if digest:
            self.diagnostician.keep_rank_digests(replica_id, step, rank_digests, tuple(
                self.host_registry.rank_holders.get((replica_id, k)) for k in range(r.world_size)))
        self._record_digest(r, step, digest, caught_up, now)

    def report_commit_failed(self, replica_id: str, step: int, reason: str, now: float, *, quorum_id: int,
                             host_id: str = "") -> None:
        replicas = self.replica_registry
        r = replicas.known(replica_id)
        self._check_coordinator_host(replica_id, host_id)
        replicas.check_given(r, quorum_id, step, "a failed commit of")
        replicas.commit_failed(r, step, reason, now)

    def report_finished(self, replica_id: str, step: int, now: float, *, reason: str = "",
                        host_id: str = "") -> JobState:
        """Its coordinator says the replica trained to the end: FINISHED (controller.core.finishing)."""
        replicas = self.replica_registry
        r = replicas.known(replica_id)
        self._check_coordinator_host(replica_id, host_id)
        replicas.check_finished(r, step)
        # Validated: from here on the request changes state.
        if replicas.finish(r, step, reason, now):
            self._replica_settled(r, now)
            self.rounds.finished_at(step)
        return self.lifecycle.job_state

    def report_replica_dead(self, replica_id: str, reason: str, now: float, *, host_id: str = "") -> None:
        self.replica_registry.known(replica_id)
        self._check_coordinator_host(replica_id, host_id)
        reason = clip_text(reason, self.settings.max_reason_chars)
        self.kill_replica(replica_id, DeathCause.REPORTED, reason or "reported dead", now)

    # -- liveness ------------------------------------------------------------------------------

    def kill_replica(self, replica_id: str, cause: DeathCause, reason: str, now: float) -> bool:
        if not self.replica_registry.kill(replica_id, cause, reason, now):
            return False
        self._replica_settled(self.replicas[replica_id], now)
        return True

    def _replica_settled(self, r: Replica, now: float) -> None:
        """`r` became DEAD or FINISHED: out of the open round (a dead one's telemetry groups
        form anew when it returns), and the job may have COMPLETED."""
        self.rounds.leave(r.replica_id)
        if r.state == ReplicaState.DEAD:
            self.diagnostician.forget_replica(r.replica_id, now)
        self.act(self.lifecycle.replica_settled(self.replicas, now), now)

    def coordinator_connection_lost(self, replica_id: str, how: str, now: float) -> bool:
        return self.replica_registry.connection_lost(replica_id, how, now)

    def expire_replicas(self, now: float) -> None:
        for rid in self.replica_registry.expire(now, self.silence):
            self._replica_settled(self.replicas[rid], now)

    def live_replicas(self) -> frozenset[str]:
        return self.replica_registry.live()

    def dead_replicas(self) -> frozenset[str]:
        return self.replica_registry.dead()

    def expire(self, now: float) -> None:
        """Declare dead whoever has been silent past the heartbeat timeout, compare the digests
        that waited long enough, and run the periodic diagnosis. A completed job's agents leave:
        their silence is no failure (no host deaths, no swaps, no diagnosis)."""
        if not self.lifecycle.job_over:
            self.act(self.host_registry.expire(now, self.silence), now)
        self.expire_replicas(now)
        self.compare_digests(now)
        if not self.lifecycle.job_over:
            self._carry_out(self.diagnostician.periodic(self._facts(), now), now)
        live, dead = self.replica_registry.live(), self.replica_registry.dead()
        self.act(self.lifecycle.check_progress(self.replicas, self.host_registry.hosts.values(),
                                               bool(live) or len(dead) != len(self.replicas),
                                               self.rounds.max_committed_step >= 0, now), now)

    def act(self, intents, now: float) -> None:
        """Carry out what a component asked (controller.core.intents), in order."""
        for i in intents:
            if isinstance(i, Announce):
                self._event(now, i.kind, i.subject, i.message, i.cause, i.level)
            elif isinstance(i, Persist):
                self.writes.mark(i.section, i.urgent)
            elif isinstance(i, EndRounds):
                self.rounds.end(i.reason)
            elif isinstance(i, KillReplica):
                self.kill_replica(i.replica_id, i.cause, i.reason, now)
            elif isinstance(i, MoveReplica):
                r = self.replicas.get(i.replica_id)
                if r is not None and not (i.unless_settled and r.state in SETTLED):
                    if self.replica_registry.transition(r, i.state, i.reason, now):
                        self._replica_settled(r, now)
            elif isinstance(i, Diagnose):
                self._carry_out(self.diagnostician.verdicts(list(i.verdicts), self._facts(), now), now)
            elif isinstance(i, Evict):
                self._evict_for_diagnosis(i, now)
            elif isinstance(i, RestartReplica):
                self._restart_in_place(i.replica_id, i.why, now)
            elif isinstance(i, ReplaceHost):
                self.host_registry.replace(i.host_id, i.reason, now)
            elif isinstance(i, MoveWork):
                self.host_registry.move_work(i.host_id, now)
            else:
                raise TypeError(f"{i!r} is not an intent")

    def _carry_out(self, batches, now: float) -> None:
        """Intents that come one batch at a time, each decided on what the last one left."""
        for intents in batches:
            self.act(intents, now)

    # -- the diagnosis (Diagnostician decides; evictions go through the host registry) ---------

    @property
    def diagnosis(self):
        """The diagnosis engine: telemetry, findings, the decision log (read by the service)."""
        return self.diagnostician.engine

    def _facts(self) -> Facts:
        hosts = self.host_registry
        return Facts(hosts.hosts, self.replicas, hosts.rank_holders, self.quorum)

    def deregister_agent(self, host_id: str, incarnation: str, reason: str, now: float) -> str:
        """An agent leaves cleanly (HostRegistry decides); its replica is taken out if it ran one."""
        message, kills = self.host_registry.deregister_agent(host_id, incarnation, reason, now)
        self.act(kills, now)
        return message

    def drain(self, host_id: str, now: float) -> str:
        """An operator moves the host's work to a spare (HostRegistry decides)."""
        message, kills = self.host_registry.drain(host_id, now)
        self.act(kills, now)
        return message

    def report_telemetry(self, report: HostReport, agent_secret: str, now: float) -> list[str]:
        """Keep an agent's summary (its agent secret checked); returns what was left out and why."""
        self.diagnostician.check(report)
        h = self.host_registry.authenticate_agent(report.host_id, agent_secret)
        findings, ignored = self.diagnostician.ingest(report, h, self.replicas, now)
        self._carry_out(self.diagnostician.decide(findings, self._facts(), now), now)
        return ignored

    def _evict_for_diagnosis(self, i: Evict, now: float) -> None:
        try:
            _, kills = self.host_registry.evict(i.host_id, "diagnosis", i.reason, now)
        except RequestError as exc:  # the host changed between deciding and acting
            self._event(now, "diagnosis", i.host_id, f"{i.finding}: eviction of host {i.host_id} failed: {exc}",
                        i.cause)
            return
        self.act(kills, now)
        self.diagnostician.evicted(i.host_id, now)

    # -- trainers' exits (the hosts check them, JobLifecycle and RestartBudget decide) --------

    def trainer_exit(self, host_id: str, replica_id: str, rank: int, now: float, *, exit_code: int = 0,
                     signal: int = 0, stderr_tail: str = "", gave_up: bool = False, version: int = 0) -> None:
        """A trainer exited. A death restarts its replica as a unit, or replaces the host when
        the host's restart budget is spent or its agent asks (`gave_up`); a clean exit after the
        replica finished is its end. An exit from a trainer older than the host's assignment
        (`version` below it: its replica's restart is already ordered) changes nothing."""
        why, cause = self.host_registry.trainer_exited(host_id, replica_id, rank, now, exit_code=exit_code,
                                                       signal=signal, stderr_tail=stderr_tail, version=version)
        if not why:
            return
        death, intents = self.lifecycle.trainer_exited(self.replicas.get(replica_id), host_id, replica_id, rank,
                                                       exit_code, signal, why, cause)
        self.act(intents, now)
        if not death:
            return  # a clean finish, or the job is over
        if gave_up:
            self.act([ReplaceHost(host_id, f"its agent gave up: {why}")], now)
        else:
            host = self.host_registry.hosts[host_id]
            intents = self.restart_budget.after_death(host, replica_id, why, now)
            self.host_registry.touch(host, urgent=True)  # its restart times, with the restart's orders
            self.act(intents, now)

    def _restart_in_place(self, rid: str, why: str, now: float) -> None:
        hosts = self.host_registry
        with self.outbox.batch() as orders:
            restarted = hosts.restart_replica(rid, why)
        if restarted:
            self.replica_registry.count_restart(rid)
            self._event(now, "replica_restart", rid, f"replica {rid} restarts its ranks on {restarted} host(s) "
                                                     f"together: {why}")
        hosts.announce_orders(orders, now)

    # -- digests (DivergenceTracker decides) ---------------------------------------------------

    def _record_digest(self, r: Replica, step: int, digest: str, caught_up: bool, now: float) -> None:
        """After `r` committed `step` (already recorded): keep its digest, heal or compare."""
        self.replica_registry.keep_digest(r, step, digest)

        def trusted() -> list[str]:  # asked only by a re-sync: not O(replicas) per commit
            return [x.replica_id for x in self.replicas.values() if x.state == ReplicaState.HEALTHY and x is not r]

        sources = self.quorum.recover.get(r.replica_id, ()) if self.quorum else ()
        self.act(self.divergence.committed(r, step, digest, caught_up, trusted, sources, now), now)
        self.compare_digests(now)

    def compare_digests(self, now: float) -> None:
        """Decide the steps whose digests are all in, or that waited long enough."""
        self.act(self.divergence.compare(now, self._digest_waiting), now)

    def _digest_waiting(self, step: int) -> list[str]:
        """Members of the current quorum that may still report `step`."""
        if self.quorum is None:
            return []
        out = []
        for m in self.quorum.members:
            r = self.replicas.get(m.replica_id)
            if r is not None and r.state not in SETTLED and r.committed_step < step:
                out.append(m.replica_id)
        return out

    def silence(self, last_seen: float, now: float) -> str:
        """Why a record last seen at `last_seen` counts as dead now, or "" while it does not.
        Silence is counted from `last_seen` or from the end of a takeover grace, the later."""
        limit = self.settings.heartbeat_timeout_s
        since = max(last_seen, self.silence_counted_from)
        if now - since <= limit:
            return ""
        grace = ", counted from the end of a takeover grace" if since > last_seen else ""
        return f"for {now - last_seen:.1f}s (limit {limit:g}s{grace})"

    def forgive_silence(self, now: float, grace_s: float, why: str) -> None:
        """Nobody is declared dead for silence until `grace_s` from now has passed, plus the
        heartbeat timeout: clients get that long to find this controller."""
        self.silence_counted_from = max(self.silence_counted_from, now + grace_s)
        self._event(now, "grace", "controller",
                    f"{why}: nobody is declared dead for silence before {grace_s:g}s + the heartbeat timeout "
                    f"({self.settings.heartbeat_timeout_s:g}s) have passed")

    def heartbeat_replicas(self, replica_ids, now: float) -> list[str]:
        return self.replica_registry.beat(replica_ids, now)

    def heartbeat_hosts(self, host_ids, now: float, finishing_trainers: int = 0) -> list[str]:
        hosts, suspects = self.host_registry, self.replica_registry.suspects
        for hid in host_ids:
            if (h := hosts.hosts.get(hid)) is not None:
                h.finishing_trainers = finishing_trainers
        if suspects.since:
            holders = {hosts.rank_holders.get((rid, 0)): rid for rid in suspects.since}
            for hid in host_ids:
                if hid in holders:
                    self.replica_registry.heard(holders[hid], f"a heartbeat of host {hid}, which holds its rank 0",
                                                now)
        return refresh_seen(hosts.hosts, host_ids, HostState.DEAD, now)

    def take_events(self) -> list[Event]:
        return self.journal.take()

    def leader_elected(self, candidate: str, now: float) -> None:
        """Record that `candidate` leads from `now` on (a warning when it takes over a job)."""
        running, hosts = self.quorum is not None or bool(self.replicas), len(self.host_registry.hosts)
        self._event(now, "leader", candidate,
                    f"controller {candidate} became the leader" + (
                        f", taking over at quorum {self.quorum.quorum_id if self.quorum else 0} with "
                        f"{len(self.replicas)} replicas and {hosts} hosts" if running else " of a new job"),
                    level="warning" if running else "info")

    def _event(self, now: float, kind: str, subject: str, message: str, cause: str = "",
               level: str | None = None) -> None:
        # a message is a template around a reason: twice a reason's length
        event = self.journal.record(now, kind, subject, message, cause, level,
                                    max_message_chars=2 * self.settings.max_reason_chars,
                                    keep=self.settings.recent_events)
        self.writes.mark(JOURNAL, urgent=event.level != "info")

    # -- durable snapshot --------------------------------------------------------------------

    def restore(self, replicas: dict | None, host_shards: list[dict | None], now: float,
                addresses: dict[str, dict] | None = None, journal: dict | None = None) -> None:
        """Load snapshots written by a previous leader. Everyone gets a fresh heartbeat
        allowance from `now`: silence before the failover is not held against them. An empty
        store counts quorum ids (and the host registry versions and order ids) up from the
        clock, so clients that outlive a controller without a durable store never see them go back."""
        self.rounds.restore(replicas, journal, now)
        if replicas:
            self.replica_registry.restore(replicas["replicas"], replicas["deaths"], addresses, now)
            self.lifecycle.restore(replicas.get("completed_at"), replicas.get("failed_at"),
                                   replicas.get("job_end_reason", ""))
            self.divergence.restore(replicas.get("digest_mismatches", 0), replicas.get("digests"), now)
        if journal:
            self.journal.restore(journal)
        self.goodput.restore((replicas or {}).get("goodput"), (journal or {}).get("goodput"), now)
        for r in self.replicas.values():
            if r.replica_id in self.goodput.replicas:
                self.goodput.replicas[r.replica_id].healthy = r.state == ReplicaState.HEALTHY
        self.host_registry.restore(replicas, host_shards, now)
        self.writes.clear()  # what was loaded is what the store holds
