"""ControllerState: the whole picture the controller decides on, and its durable snapshot.

Every method takes `now` (seconds) from the caller; nothing here reads a clock, opens a
socket or touches the store. The service changes it only through `ControllerCore.step`
(controller/core/core.py), which hands back what a change asks for: the store sections it
left unwritten (`writes`, controller/core/pending_writes.py), the orders for agents
(`outbox`) and the events.

It holds the records (replicas, hosts, the round) and combines the components that own the
rest: `lifecycle` (controller.core.finishing), `divergence` (controller.core.divergence),
`restart_budget` (controller.core.restarts) and `diagnostician`
(controller.core.diagnosis.acting). A component changes only its own data and returns intents
(controller.core.intents), which `act` carries out here, in one place. The replica and host
registries (controller.core.replicas, controller.core.hosts) are still mixins of this class.
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
from controller.core.model import (
    SETTLED, Assignment, Event, Host, HostState, OrderOut, Quorum, Replica, ReplicaState, host_can_run,
)
from controller.core.replicas import ReplicaRegistry
from controller.core.pending_writes import JOURNAL, REPLICAS, PendingWrites
from controller.core.restarts import RestartBudget
from controller.core.sizes import ShardBudget
from controller.core.suspects import Suspects
from controller.core import retention, snapshots
from controller.settings import ControllerSettings

#: Assignment versions reserved per write of the replicas snapshot.
VERSION_BLOCK = 1024
class _Settings:
    """`state.settings = x` (tests change settings) hands `x` to the components as well.
    Only setting is hooked: with no __get__, reading is the plain instance lookup (it is read
    on every request)."""

    COMPONENTS = ("lifecycle", "restart_budget", "diagnostician")

    def __set__(self, state, settings: ControllerSettings) -> None:
        state.__dict__["settings"] = settings
        for name in self.COMPONENTS:
            if name in state.__dict__:
                state.__dict__[name].settings = settings


class ControllerState(ReplicaRegistry, HostRegistry):
    settings = _Settings()

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings.validate()
        self.replicas: dict[str, Replica] = {}
        #: cache of live_replicas() (None: to be computed)
        #: (live, dead) replica ids, until a replica registers or changes state
        self._live: tuple[frozenset[str], frozenset[str]] | None = None
        self.hosts: dict[str, Host] = {}
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
        self.outbox: list[OrderOut] = []
        self.order_seq = 0
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
        #: assignment versions: the last one given, and the ceiling persisted ahead of it
        self.assignment_seq = 0
        self.version_ceiling = 0
        self.replica_versions: dict[str, int] = {}
        self.swaps = 0
        self.deaths: dict[str, int] = {}
        self.rank_holders: dict[tuple[str, int], str] = {}
        #: the store sections changed and not yet handed out for writing (pending_writes.py)
        self.writes = PendingWrites()
        #: each host's replica restarts, against the restart budget (controller.core.restarts)
        self.restart_budget = RestartBudget(self.settings)
        #: replica digests compared per step, DIVERGED replicas (controller.core.divergence)
        self.divergence = DivergenceTracker(self.settings)
        #: the job's ending: COMPLETED or FAILED, when and why (controller.core.finishing)
        self.lifecycle = JobLifecycle(self.settings)
        #: replicas whose leader's connection closed without goodbye (controller.core.suspects)
        self.suspects = Suspects()
        #: bytes each host shard may grow to (see controller.core.sizes)
        self.shard_budget = ShardBudget()
        #: host ids by shard, and each host's encoded record until it changes (see _touch)
        self.shard_members: dict[int, dict[str, None]] = {}
        self.encoded_hosts: dict[str, bytes] = {}
        #: telemetry, findings and what was done about them (controller.core.diagnosis.acting)
        self.diagnostician = Diagnostician(self.settings)

    def expire(self, now: float) -> None:
        """Declare dead whoever has been silent past the heartbeat timeout, compare the digests
        that waited long enough, and run the periodic diagnosis. A completed job's agents leave:
        their silence is no failure (no host deaths, no swaps, no diagnosis)."""
        if not self.lifecycle.job_over:
            self.expire_hosts(now)
        self.expire_replicas(now)
        self.compare_digests(now)
        if not self.lifecycle.job_over:
            self._carry_out(self.diagnostician.periodic(self._facts(), now), now)
        live, dead = self._liveness()
        self.act(self.lifecycle.check_progress(self.replicas, self.hosts.values(),
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
                h = self.hosts[i.host_id]
                self._cordon(h, "failure", i.reason, now)
                self._swap(h, now)
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
        return Facts(self.hosts, self.replicas, self.rank_holders, self.quorum)

    def report_telemetry(self, report: HostReport, agent_secret: str, now: float) -> list[str]:
        """Keep an agent's summary (its agent secret checked); returns what was left out and why."""
        self.diagnostician.check(report)
        h = self.authenticate_agent(report.host_id, agent_secret)
        findings, ignored = self.diagnostician.ingest(report, h, self.replicas, now)
        self._carry_out(self.diagnostician.decide(findings, self._facts(), now), now)
        return ignored

    def _evict_for_diagnosis(self, i: Evict, now: float) -> None:
        try:
            self.evict(i.host_id, "diagnosis", i.reason, now)
        except RequestError as exc:  # the host changed between deciding and acting
            self._event(now, "diagnosis", i.host_id, f"{i.finding}: eviction of host {i.host_id} failed: {exc}",
                        i.cause)
            return
        self.diagnostician.evicted(i.host_id, now)

    # -- replica restarts (RestartBudget decides; the hosts carry them out) ---------------------

    def replica_hosts(self, replica_id: str) -> list[Host]:
        """The hosts that hold ranks of the replica, by their lowest rank."""
        holders = {h for (rid, _), h in self.rank_holders.items() if rid == replica_id}
        hosts = [self.hosts[h] for h in holders]
        return sorted(hosts, key=lambda h: min(h.assignment.ranks))

    def _restart_in_place(self, rid: str, why: str, now: float) -> None:
        first = len(self.outbox)
        restarted = self.restart_replica(rid, why)
        if restarted:
            r = self.replicas.get(rid)
            if r is not None:
                r.restarts += 1
                self.writes.mark(REPLICAS)
            self._event(now, "replica_restart", rid, f"replica {rid} restarts its ranks on {restarted} host(s) "
                                                     f"together: {why}")
        self._orders_event(first, now)

    def restart_replica(self, replica_id: str, why: str, *, skip: Host | None = None,
                        version: int | None = None) -> int:
        """Order every host of the replica (but `skip`, which learns it otherwise) to restart
        its ranks together, under one new replica version (`version`: one already decided for
        the replica, e.g. the spare's ASSIGN). If a host of the replica cannot run, stop the
        others instead: the replica is down until that host is replaced or back. Returns how
        many hosts restart (0: the replica is down). The caller announces the orders
        (`_orders_event`)."""
        hosts = self.replica_hosts(replica_id)
        down = [h for h in hosts if not host_can_run(h)]
        if down:
            for h in hosts:
                if h is not skip and host_can_run(h):
                    self._order(h.host_id, "STOP", h.assignment,
                                f"replica {replica_id} is down until host {down[0].host_id} is replaced: {why}")
            return 0
        version = self._next_version() if version is None else version
        self.replica_versions[replica_id] = version
        for h in hosts:
            h.assignment_version = version
            self._touch(h, urgent=True)
        for h in hosts:
            if h is not skip:
                self._order(h.host_id, "RESTART", h.assignment, f"replica {replica_id} restarts as a unit: {why}")
        return len(hosts)

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

    def _next_version(self) -> int:
        """The next assignment version. The persisted ceiling runs ahead of it in blocks, so a
        new leader starts above every version given before without a write per decision."""
        self.assignment_seq += 1
        if self.assignment_seq > self.version_ceiling:
            self.version_ceiling = self.assignment_seq + VERSION_BLOCK
            self.writes.mark(REPLICAS)
        return self.assignment_seq

    def heartbeat_replicas(self, replica_ids, now: float) -> list[str]:
        if self.suspects.since:
            for rid in replica_ids:
                self._heard(rid, f"its leader's heartbeat", now)
        return _beat(self.replicas, replica_ids, ReplicaState.DEAD, now)

    def heartbeat_hosts(self, host_ids, now: float) -> list[str]:
        if self.suspects.since:
            holders = {self.rank_holders.get((rid, 0)): rid for rid in self.suspects.since}
            for hid in host_ids:
                if hid in holders:
                    self._heard(holders[hid], f"a heartbeat of host {hid}, which holds its rank 0", now)
        return _beat(self.hosts, host_ids, HostState.DEAD, now)

    def _heard(self, replica_id: str, what: str, now: float) -> None:
        if self.suspects.heard(replica_id, now):
            self._event(now, "replica", replica_id, f"replica {replica_id} is no longer suspect: {what} proves it "
                                                    f"alive")

    def take_orders(self) -> list[OrderOut]:
        out, self.outbox = self.outbox, []
        return out

    def undelivered(self, orders) -> None:
        """Orders taken but not delivered (their decisions' write failed): they go out with the
        next write that succeeds, before any newer ones."""
        self.outbox[:0] = list(orders)

    def take_events(self) -> list[Event]:
        out, self.fresh_events = self.fresh_events, []
        return out

    def leader_elected(self, candidate: str, now: float) -> None:
        """Record that `candidate` leads from `now` on (a warning when it takes over a job)."""
        running = self.quorum is not None or bool(self.replicas)
        self._event(now, "leader", candidate,
                    f"controller {candidate} became the leader" + (
                        f", taking over at quorum {self.quorum.quorum_id if self.quorum else 0} with "
                        f"{len(self.replicas)} replicas and {len(self.hosts)} hosts" if running else " of a new job"),
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
            # An empty store: count ids and versions up from the clock (ms), so clients that
            # outlive a controller without a durable store never see them go back.
            self.first_quorum_id = max(int(now * 1000), 1)
            self.version_ceiling = self.order_seq = int(now * 1000)
        if replicas:
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
            self.swaps = replicas["swaps"]
            self.deaths = dict(replicas["deaths"])
            self.lifecycle.restore(replicas.get("completed_at"), replicas.get("failed_at"),
                                   replicas.get("job_end_reason", ""))
            # Order ids must never repeat (agents answer a repeated id from memory), and the
            # counter is written only now and then: continue from the clock if it is ahead.
            self.order_seq = max(replicas["order_seq"], int(now * 1000))
            (self.history_step, self.history_epoch, self.branch_start_step,
             self.newest_checkpoint_step) = replicas.get("history", [self.max_committed_step, 0, -1, -1])
            self.steps_lost = dict(replicas.get("steps_lost", {}))
            self.history_changes = dict(replicas.get("history_changes", {}))
            self.version_ceiling = replicas.get("version_ceiling", 0)
            self.replica_versions = dict(replicas.get("replica_versions", {}))
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
        for shard in host_shards:
            for d in (shard or {}).get("hosts", ()):
                a = d["assignment"]
                h = self._add_host(Host(**dict(d, state=HostState(d["state"]), last_seen=now, assignment=None)))
                if a:
                    self._index(h, Assignment(a[0], tuple(a[1]), a[2]))
                    rid = a[0]
                    self.replica_versions[rid] = max(self.replica_versions.get(rid, 0), h.assignment_version)
                self.version_ceiling = max(self.version_ceiling, h.assignment_version)
        self._live = None
        # Every version given before this point is at most the ceiling: continue above it.
        self.assignment_seq = self.version_ceiling
        self.reserve_restored_hosts()
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
