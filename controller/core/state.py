"""ControllerState: the whole picture the controller decides on, and its durable snapshot.

Every method takes `now` (seconds) from the caller; nothing here reads a clock, opens a
socket or touches the store. The service changes it only through `ControllerCore.step`
(controller/core/core.py), which hands back what a change asks for: the store sections it
left unwritten (`writes`, controller/core/pending_writes.py), the orders for agents
(`outbox`) and the events.

It holds the replica records and the round, and combines the components that own the rest:
`host_registry` (controller.core.hosts: hosts, assignments, versions, orders), `lifecycle`
(controller.core.finishing), `divergence` (controller.core.divergence), `restart_budget`
(controller.core.restarts) and `diagnostician` (controller.core.diagnosis.acting). A component
changes only its own data and returns intents (controller.core.intents), which `act` carries
out here, in one place; the host registry is handed what it needs at construction (the pending
writes, `_event`, `kill_replica`). The replica registry (controller.core.replicas) is still a
mixin of this class.
"""

from __future__ import annotations


from controller.core.checks import clip_text
from controller.core.diagnosis.acting import Diagnostician, Facts
from controller.core.diagnosis.telemetry import HostReport
from controller.core.errors import RequestError
from controller.core.divergence import DivergenceTracker
from controller.core.events import level_of
from controller.core.finishing import JobLifecycle
from controller.core.goodput import GoodputTracker, NoGoodput
from controller.core.hosts import HostRegistry
from controller.core.intents import (
    Announce, Diagnose, EndRounds, Evict, KillReplica, MoveReplica, Persist, ReplaceHost, RestartReplica,
)
from controller.core.quorum_codec import quorum_from_dict
from controller.core.model import SETTLED, Event, HostState, Quorum, Replica, ReplicaState
from controller.core.replicas import ReplicaRegistry
from controller.core.pending_writes import JOURNAL, REPLICAS, PendingWrites
from controller.core.restarts import RestartBudget
from controller.core.suspects import Suspects
from controller.core import retention, snapshots
from controller.settings import ControllerSettings


class _Settings:
    """`state.settings = x` (tests change settings) hands `x` to the components as well.
    Only setting is hooked: with no __get__, reading is the plain instance lookup (it is read
    on every request)."""

    COMPONENTS = ("lifecycle", "restart_budget", "diagnostician", "host_registry")

    def __set__(self, state, settings: ControllerSettings) -> None:
        state.__dict__["settings"] = settings
        for name in self.COMPONENTS:
            if name in state.__dict__:
                state.__dict__[name].settings = settings


#: what ControllerState shows of its host registry
HOST_NAMES = frozenset((
    "hosts", "rank_holders", "replica_versions", "swaps", "order_seq", "assignment_seq", "version_ceiling", "outbox",
    "register_agent", "deregister_agent", "ack_order", "orders_on_connect", "is_superseded", "authenticate_agent",
    "drain", "evict", "cordon", "uncordon", "encoded_host_shard", "replica_endpoints", "restart_replica",
    "replica_hosts", "take_orders", "undelivered",
))


class ControllerState(ReplicaRegistry):
    settings = _Settings()

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings.validate()
        self.replicas: dict[str, Replica] = {}
        #: cache of live_replicas() (None: to be computed)
        #: (live, dead) replica ids, until a replica registers or changes state
        self._live: tuple[frozenset[str], frozenset[str]] | None = None
        self.quorum: Quorum | None = None
        #: Quorum ids count up from here. A controller that starts with an empty store starts
        #: from its clock (ms), so trainers that outlive it never see a generation go back.
        self.first_quorum_id = 1
        self.quorum_history: list[Quorum] = []
        self.round_joined: dict[str, int] = {}
        #: joiners this round with a new process or new addresses: the quorum id must change
        self.round_renewed: set[str] = set()
        self.round_first_join_at: float | None = None
        #: (the round's first join time, when it first had a majority): see quorum.quorate_since
        self.round_quorate: tuple[float | None, float] | None = None
        self.round_reason = "no replica has joined this round"
        self.round_wake_at: float | None = None
        self.events: list[Event] = []
        self.event_tiers: list[int] = []  # how many events of each retention tier the ring holds
        #: events not yet handed to the service's event log (drained by `take_events`)
        self.fresh_events: list[Event] = []
        self.event_seq = 0
        self.goodput = (GoodputTracker if settings.telemetry else NoGoodput)(settings.replicas)
        self.steps_committed = 0
        #: the highest step any replica ever committed
        self.max_committed_step = -1
        #: the job's current history (see controller.core.rollback): its newest committed
        #: step, its number (bumped by every rollback and roll-forward), the step its latest
        #: rollback resumed at (-1: none), and the newest durable checkpoint leaders reported
        self.history_step = -1
        self.history_epoch = 0
        self.branch_start_step = -1
        self.newest_checkpoint_step = -1
        #: committed steps given up: "rollback" (gone back past them), "abandoned" (trained on
        #: a history that a returning replica's newer state replaced)
        self.steps_lost: dict[str, int] = {}
        #: how often the history changed: "rollback", "roll_forward"
        self.history_changes: dict[str, int] = {}
        #: since when a round has been waiting before a rollback (not durable: a new leader waits anew)
        self.rollback_wait_since: float | None = None
        #: silence before this moment is not held against anyone (a takeover's grace)
        self.silence_counted_from = float("-inf")
        self.deaths: dict[str, int] = {}
        #: the store sections changed and not yet handed out for writing (pending_writes.py)
        self.writes = PendingWrites()
        #: hosts, their assignments, versions and orders (controller.core.hosts)
        self.host_registry = HostRegistry(self.settings, self.writes, self._event, self.kill_replica)
        #: each host's replica restarts, against the restart budget (controller.core.restarts)
        self.restart_budget = RestartBudget(self.settings)
        #: replica digests compared per step, DIVERGED replicas (controller.core.divergence)
        self.divergence = DivergenceTracker(self.settings)
        #: the job's ending: COMPLETED or FAILED, when and why (controller.core.finishing)
        self.lifecycle = JobLifecycle(self.settings)
        #: replicas whose leader's connection closed without goodbye (controller.core.suspects)
        self.suspects = Suspects()
        #: telemetry, findings and what was done about them (controller.core.diagnosis.acting)
        self.diagnostician = Diagnostician(self.settings)

    def expire(self, now: float) -> None:
        """Declare dead whoever has been silent past the heartbeat timeout, compare the digests
        that waited long enough, and run the periodic diagnosis. A completed job's agents leave:
        their silence is no failure (no host deaths, no swaps, no diagnosis)."""
        if not self.lifecycle.job_over:
            self.host_registry.expire(now, self.silence)
        self.expire_replicas(now)
        self.compare_digests(now)
        if not self.lifecycle.job_over:
            self._carry_out(self.diagnostician.periodic(self._facts(), now), now)
        live, dead = self._liveness()
        self.act(self.lifecycle.check_progress(self.replicas, self.host_registry.hosts.values(),
                                               bool(live) or len(dead) != len(self.replicas), now), now)

    def act(self, intents, now: float) -> None:
        """Carry out what a component asked (controller.core.intents), in order."""
        for i in intents:
            if isinstance(i, Announce):
                self._event(now, i.kind, i.subject, i.message, i.cause, i.level)
            elif isinstance(i, Persist):
                self.writes.mark(i.section, i.urgent)
            elif isinstance(i, EndRounds):
                self.round_reason, self.round_wake_at = i.reason, None
            elif isinstance(i, KillReplica):
                self.kill_replica(i.replica_id, i.cause, i.reason, now)
            elif isinstance(i, MoveReplica):
                r = self.replicas.get(i.replica_id)
                if r is not None and not (i.unless_settled and r.state in SETTLED):
                    self._transition(r, i.state, i.reason, now)
            elif isinstance(i, Diagnose):
                self._carry_out(self.diagnostician.verdicts(list(i.verdicts), self._facts(), now), now)
            elif isinstance(i, Evict):
                self._evict_for_diagnosis(i, now)
            elif isinstance(i, RestartReplica):
                self._restart_in_place(i.replica_id, i.why, now)
            elif isinstance(i, ReplaceHost):
                self.host_registry.replace(i.host_id, i.reason, now)
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

    def report_telemetry(self, report: HostReport, agent_secret: str, now: float) -> list[str]:
        """Keep an agent's summary (its agent secret checked); returns what was left out and why."""
        self.diagnostician.check(report)
        h = self.host_registry.authenticate_agent(report.host_id, agent_secret)
        findings, ignored = self.diagnostician.ingest(report, h, self.replicas, now)
        self._carry_out(self.diagnostician.decide(findings, self._facts(), now), now)
        return ignored

    def _evict_for_diagnosis(self, i: Evict, now: float) -> None:
        try:
            self.host_registry.evict(i.host_id, "diagnosis", i.reason, now)
        except RequestError as exc:  # the host changed between deciding and acting
            self._event(now, "diagnosis", i.host_id, f"{i.finding}: eviction of host {i.host_id} failed: {exc}",
                        i.cause)
            return
        self.diagnostician.evicted(i.host_id, now)

    # -- trainers' exits (the hosts check them, JobLifecycle and RestartBudget decide) --------

    def trainer_exit(self, host_id: str, replica_id: str, rank: int, now: float, *, exit_code: int = 0,
                     signal: int = 0, stderr_tail: str = "", gave_up: bool = False, version: int = 0) -> None:
        """A trainer exited. A death restarts its replica as a unit, or replaces the host when
        the host's restart budget is spent or its agent asks (`gave_up`); a clean exit after the
        replica finished is its end. An exit from a trainer older than the host's assignment
        (`version` below it: its replica's restart is already ordered) changes nothing."""
        why = self.host_registry.trainer_exited(host_id, replica_id, rank, now, exit_code=exit_code, signal=signal,
                                                stderr_tail=stderr_tail, version=version)
        if not why:
            return
        death, intents = self.lifecycle.trainer_exited(self.replicas.get(replica_id), host_id, replica_id, rank,
                                                       exit_code, signal, why)
        self.act(intents, now)
        if not death:
            return  # a clean finish, or the job is over
        if gave_up:
            self.act([ReplaceHost(host_id, f"its agent gave up: {why}")], now)
        else:
            self.act(self.restart_budget.after_death(host_id, replica_id, why, now), now)

    def _restart_in_place(self, rid: str, why: str, now: float) -> None:
        hosts = self.host_registry
        first = len(hosts.outbox)
        restarted = hosts.restart_replica(rid, why)
        if restarted:
            r = self.replicas.get(rid)
            if r is not None:
                r.restarts += 1
                self.writes.mark(REPLICAS)
            self._event(now, "replica_restart", rid, f"replica {rid} restarts its ranks on {restarted} host(s) "
                                                     f"together: {why}")
        hosts.announce_orders(first, now)

    # -- digests (DivergenceTracker decides) ---------------------------------------------------

    def _record_digest(self, r: Replica, step: int, digest: str, caught_up: bool, now: float) -> None:
        """After `r` committed `step` (already recorded): keep its digest, heal or compare."""
        if digest:
            r.digest, r.digest_step = digest, step
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

    digest_ledger = property(lambda self: self.divergence.ledger)
    digest_mismatches = property(lambda self: self.divergence.mismatches)

    # -- the job's ending, as read by the service and the tests (JobLifecycle owns it) --------

    job_state = property(lambda self: self.lifecycle.job_state)
    job_over = property(lambda self: self.lifecycle.job_over)
    job_state_reason = property(lambda self: self.lifecycle.job_state_reason)
    completed_at = property(lambda self: self.lifecycle.completed_at)
    failed_at = property(lambda self: self.lifecycle.failed_at)
    job_end_reason = property(lambda self: self.lifecycle.job_end_reason)
    stuck_since = property(lambda self: self.lifecycle.stuck_since)

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
        if self.suspects.since:
            for rid in replica_ids:
                self._heard(rid, f"its leader's heartbeat", now)
        return _beat(self.replicas, replica_ids, ReplicaState.DEAD, now)

    def heartbeat_hosts(self, host_ids, now: float) -> list[str]:
        hosts = self.host_registry
        if self.suspects.since:
            holders = {hosts.rank_holders.get((rid, 0)): rid for rid in self.suspects.since}
            for hid in host_ids:
                if hid in holders:
                    self._heard(holders[hid], f"a heartbeat of host {hid}, which holds its rank 0", now)
        return _beat(hosts.hosts, host_ids, HostState.DEAD, now)

    def _heard(self, replica_id: str, what: str, now: float) -> None:
        if self.suspects.heard(replica_id, now):
            self._event(now, "replica", replica_id, f"replica {replica_id} is no longer suspect: {what} proves it "
                                                    f"alive")

    def take_events(self) -> list[Event]:
        out, self.fresh_events = self.fresh_events, []
        return out

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
        self.event_seq += 1
        message = clip_text(message, 2 * self.settings.max_reason_chars)  # a template around a reason
        event = Event(now, kind, subject, message, cause, level or level_of(kind), self.event_seq)
        if len(self.event_tiers) != retention.TIERS:  # the ring was set anew (restored): count it
            self.event_tiers = retention.counts(self.events)
        retention.admit(self.events, self.event_tiers, event, self.settings.recent_events)  # kept by level
        self.fresh_events.append(event)
        self.writes.mark(JOURNAL, urgent=event.level != "info")

    # -- the hosts, as the service and the tests read them (HostRegistry owns them) -----------

    def __getattr__(self, name: str):
        """`state.hosts`, `state.register_agent`, ...: the host registry's (HOST_NAMES), for
        the service and the tests; the core's own code calls the registry."""
        if name in HOST_NAMES:
            return getattr(self.host_registry, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- durable snapshot --------------------------------------------------------------------

    snapshot_section = snapshots.section
    snapshot_replicas = snapshots.replicas_section
    snapshot_journal = snapshots.journal_section
    snapshot_addresses = snapshots.addresses_section
    addresses_snapshot = staticmethod(snapshots.addresses_snapshot)
    snapshot_hosts = snapshots.host_section
    snapshot_host_shards = snapshots.host_sections

    def restore(self, replicas: dict | None, host_shards: list[dict | None], now: float,
                addresses: dict[str, dict] | None = None, journal: dict | None = None) -> None:
        """Load snapshots written by a previous leader. Everyone gets a fresh heartbeat
        allowance from `now`: silence before the failover is not held against them."""
        if not replicas:
            # An empty store: count quorum ids up from the clock (ms), so clients that outlive
            # a controller without a durable store never see them go back (the host registry
            # does the same for versions and order ids).
            self.first_quorum_id = max(int(now * 1000), 1)
        else:
            self.first_quorum_id = replicas.get("first_quorum_id", 1)
            self.quorum = quorum_from_dict(replicas["quorum"]) if replicas["quorum"] else None
            self.replicas = {}
            for d in replicas["replicas"]:
                # a record written before the coordinator's address had its name
                d = {("coordinator_address" if k == "leader_address" else k): v for k, v in d.items()}
                a = (addresses or {}).get(d["replica_id"]) or {"ftar": (), "state": ()}
                self.replicas[d["replica_id"]] = Replica(
                    **dict(d, state=ReplicaState(d["state"]), ftar_addresses=tuple(a["ftar"]),
                           state_addresses=tuple(a["state"]), last_seen=now, given_restored=True))
            self.steps_committed = replicas["steps_committed"]
            self.max_committed_step = replicas.get("max_committed_step", -1)
            self.deaths = dict(replicas["deaths"])
            self.lifecycle.restore(replicas.get("completed_at"), replicas.get("failed_at"),
                                   replicas.get("job_end_reason", ""))
            (self.history_step, self.history_epoch, self.branch_start_step,
             self.newest_checkpoint_step) = replicas.get("history", [self.max_committed_step, 0, -1, -1])
            self.steps_lost = dict(replicas.get("steps_lost", {}))
            self.history_changes = dict(replicas.get("history_changes", {}))
            self.divergence.restore(replicas.get("digest_mismatches", 0), replicas.get("digests"), now)
        if journal:
            self.quorum_history = [quorum_from_dict(q) for q in journal["history"]]
            self.events = [Event(*e) for e in journal["events"]]
            self.event_tiers = []  # counted again on the next event (controller.core.retention)
            self.event_seq = max(journal.get("event_seq", 0), max((e.seq for e in self.events), default=0))
        self.goodput.restore((replicas or {}).get("goodput"), (journal or {}).get("goodput"), now)
        for r in self.replicas.values():
            if r.replica_id in self.goodput.replicas:
                self.goodput.replicas[r.replica_id].healthy = r.state == ReplicaState.HEALTHY
        self._live = None
        self.host_registry.restore(replicas, host_shards, now)
        self.writes.clear()  # what was loaded is what the store holds


def _beat(records: dict, ids, dead, now: float) -> list[str]:
    """Refresh `last_seen` of each live record named; return the ids that are unknown or
    dead (their senders must register or join again)."""
    unknown = []
    for key in ids:
        record = records.get(key)
        if record is None or record.state == dead:
            unknown.append(key)
        else:
            record.last_seen = now
    return unknown
