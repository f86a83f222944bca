"""Host registry: agents, spares, cordons, swaps, replica versions and the orders they
produce. A component: it owns the hosts and what belongs to them (rank holders, shards,
versions) and changes nothing else; the orders it decides go to the outbox
(controller.core.outbox), which the core empties into each step's Ready. What it needs of the
rest of the controller comes in at construction: the pending writes to mark, the outbox,
`announce` (an event) and `kill_replica` (the replica registry's). Time passed in.
"""

from __future__ import annotations

from typing import Callable

from controller.core.checks import MAX_CORDON_REASON_CHARS, check_id, clip_text, shown
from controller.core.errors import FailedPrecondition, NotFound, PermissionDenied, RetryLater
from controller.core.host_checks import check_exit, checked_registration, free_slot, orders_summary
from controller.core.host_records import HostShards, host_shard
from controller.core.identity import secret_matches
from controller.core.model import Assignment, DeathCause, Host, HostState, OrderOut, host_can_run, move_host
from controller.core.intents import KillReplica, MoveWork
from controller.core.outbox import Outbox
from controller.core.pending_writes import REPLICAS, PendingWrites, host_section
from controller.core.rendezvous import Endpoints, endpoints
from controller.core.spares import pick_spare
from controller.settings import ControllerSettings

#: Assignment versions reserved per write of the replicas snapshot.
VERSION_BLOCK = 1024


class HostRegistry:
    """Everything about hosts. `announce(now, kind, subject, message, cause="")` records an
    event. A host's failure takes its replica out: the methods that decide one return a
    `KillReplica` intent (controller.core.intents) for the core to carry out."""

    def __init__(self, settings: ControllerSettings, writes: PendingWrites, outbox: Outbox,
                 announce: Callable[..., None]) -> None:
        self.settings = settings
        self._writes, self._announce = writes, announce
        self.hosts: dict[str, Host] = {}
        #: (replica, rank) -> the host that holds it
        self.rank_holders: dict[tuple[str, int], str] = {}
        self.shards = HostShards()
        #: where the orders it decides go (controller.core.outbox: the state's, handed to the shell)
        self.outbox = outbox
        #: assignment versions: the last one given, and the ceiling persisted ahead of it
        self.assignment_seq = 0
        self.version_ceiling = 0
        self.replica_versions: dict[str, int] = {}
        self.swaps = 0


    def register_agent(self, host_id: str, incarnation: str, now: float, *, spare: bool = False,
                       slots: int = 1, labels: dict[str, str] | None = None,
                       assignment: Assignment | None = None, secret_hash: str = "", address: str = "",
                       rendezvous_port: int = 0, coordinator_port: int = 0,
                       previous_secret: str = "", standby: bool = False) -> tuple[Assignment | None, str]:
        """Register (or re-register) a host. `secret_hash` is the hash of a fresh agent secret:
        kept when this registration starts a new incarnation (or the host has none yet), so
        the caller hands the secret out only when `hosts[host_id].secret_hash` equals it.

        A new incarnation while the host's agent is live: the agent process restarted (or a
        second agent claims the host). It takes the host over at once when it presents the
        secret its predecessor was given (`previous_secret`: only that host's agent has it);
        otherwise it is told to retry (RetryLater) until the old one is declared dead by
        heartbeat silence, which moves the host's work as any host death does. A host that
        takes its assignment back (taken over, or back after a death without a spare) restarts
        its replica as a unit: the other hosts' ranks lost their peers."""
        s = self.settings
        labels, assignment, spare, address, rendezvous_port, coordinator_port = checked_registration(
            s, self.hosts.get(host_id), host_id, incarnation, slots, labels, assignment, spare, address,
            rendezvous_port, coordinator_port, previous_secret)
        h = self.hosts.get(host_id)
        if h is not None and h.incarnation == incarnation and h.state != HostState.DEAD:
            h.last_seen = now
            if not h.secret_hash and secret_hash:  # restored from a snapshot older than secrets
                h.secret_hash = secret_hash
                self.touch(h, urgent=True)
            return h.assignment, "already registered"
        if h is None and len(self.hosts) >= s.max_hosts:
            raise FailedPrecondition(f"host {host_id} is one too many: this controller keeps at most "
                                     f"{s.max_hosts} hosts (max_hosts).")
        taken_over = self._check_takeover(h, incarnation, previous_secret, now)
        claimed = assignment = self._claim(h, host_id, assignment)
        if assignment is None and not spare and (h is None or h.assignment is None):
            # None: no layout, or it is full
            assignment = free_slot(s, lambda slot: self._holder(slot, exclude=host_id))
        if not address and s.hosts_per_replica > 1 and claimed is None:
            raise FailedPrecondition(
                f"host {host_id} registered no address, but the replicas of this job span {s.hosts_per_replica} "
                f"hosts: their ranks meet at the address of their rank-0 host. Give the agent "
                f"--advertise-address (its pod IP).")
        held = h is not None and h.assignment is not None  # a new incarnation that keeps its work
        largest = Host(host_id, incarnation, HostState.ACTIVE, slots, labels, assignment, cordoned=True,
                       cordon_by="failure", secret_hash=secret_hash, address=address,
                       rendezvous_port=rendezvous_port, coordinator_port=coordinator_port)
        problem = self.shards.problem(largest, s)
        if problem:
            raise FailedPrecondition(problem)
        # Validated: from here on the request changes state.
        self.shards.reserve(largest, s)
        h, reason = self._admit(h, host_id, incarnation, now, slots=slots, labels=labels, assignment=assignment,
                                secret_hash=secret_hash, address=address, rendezvous_port=rendezvous_port,
                                coordinator_port=coordinator_port, standby=standby, taken_over=taken_over, held=held)
        return h.assignment, reason

    def _claim(self, h: Host | None, host_id: str, assignment: Assignment | None) -> Assignment | None:
        """The work a registering host claims, if nobody else holds it (None: it claims none,
        or it returns to find its work moved to a spare: it joins the pool)."""
        if assignment is not None and (h is None or h.assignment is None):
            holder = self._holder(assignment, exclude=host_id)
            if holder is not None:
                if h is None:
                    raise FailedPrecondition(
                        f"duplicate assignment: host {holder} already runs {assignment.describe()}."
                    )
                return None
        return assignment

    def _check_takeover(self, h: Host | None, incarnation: str, previous_secret: str, now: float) -> bool:
        """Whether a new incarnation takes over a host whose agent is still live (only with its
        predecessor's secret: RetryLater otherwise)."""
        limit = self.settings.heartbeat_timeout_s
        taken_over = h is not None and h.state != HostState.DEAD and now - h.last_seen <= limit
        if taken_over and not (previous_secret and secret_matches(h.secret_hash, previous_secret)):
            left = limit - (now - h.last_seen)
            raise RetryLater(
                f"host {h.host_id} is held by a live agent (incarnation {h.incarnation}, heard from "
                f"{now - h.last_seen:.1f}s ago); incarnation {incarnation} may take it over once that one is "
                f"declared dead ({left:.1f}s more of silence), or at once by presenting its predecessor's "
                f"secret (the agent's --state-dir). Retry later.")
        return taken_over

    def _admit(self, h: Host | None, host_id: str, incarnation: str, now: float, *, slots: int, labels: dict,
               assignment: Assignment | None, secret_hash: str, address: str, rendezvous_port: int,
               coordinator_port: int, standby: bool, taken_over: bool, held: bool) -> tuple[Host, str]:
        """A validated registration applied: the host record, its assignment, the orders."""
        if h is None:
            h = self._add_host(Host(host_id, incarnation, HostState.SPARE))
            verb = "registered"
        else:
            verb = (f"taken over by a restarted agent (incarnation {h.incarnation} → {incarnation}, proven by "
                    f"its predecessor's secret)" if taken_over else "registered again")
            if h.cordoned and h.cordon_by == "failure":
                h.cordoned, h.cordon_reason, h.cordon_by = False, "", ""
                verb = "returned after repair"
        h.incarnation, h.slots, h.labels, h.last_seen = incarnation, max(slots, 1), labels, now
        h.secret_hash = secret_hash
        h.address, h.rendezvous_port, h.coordinator_port = address, rendezvous_port, coordinator_port
        h.standby = standby
        new_rank0 = h.assignment is None and assignment is not None and 0 in assignment.ranks
        if h.assignment is None and assignment is not None:
            self._assign(h, assignment)
        move_host(h, HostState.ACTIVE if h.assignment else HostState.SPARE)
        # Urgent: a new incarnation carries a new secret, which a successor must know.
        self.touch(h, urgent=True)
        if h.state == HostState.SPARE and not h.cordoned:
            self._fill_orphans(now)
        role = h.assignment.describe() if h.assignment else "spare pool"
        reason = f"host {host_id} {verb}: {role}" + (" (cordoned)" if h.cordoned else "")
        self._announce(now, "host", host_id, reason)
        if h.assignment is not None and (held or new_rank0 and len(self.replica_hosts(h.assignment.replica_id)) > 1):
            # Its replica's other ranks lost their peers (or their rank 0 moved here): all restart.
            with self.outbox.batch() as orders:
                self.restart_replica(h.assignment.replica_id, f"host {host_id} {verb}", skip=h)
            self.announce_orders(orders, now)
        return h, reason

    def expire(self, now: float, silence: Callable[[float, float], str]) -> list[KillReplica]:
        """Declare dead every host whose agent is silent (`silence(last_seen, now)`: why, or "");
        returns what that asks of their replicas."""
        kills = []
        for h in list(self.hosts.values()):
            if h.state != HostState.DEAD:
                why = silence(h.last_seen, now)
                if why:
                    kills += self._host_died(h, f"agent silent {why}", now)
        return kills

    def trainer_exited(self, host_id: str, replica_id: str, rank: int, now: float, *, exit_code: int,
                       signal: int, stderr_tail: str, version: int) -> tuple[str, str]:
        """A trainer of the host exited: why, in one line ("" when it is older than the host's
        assignment, `version` below it: its replica's restart is already ordered, nothing to
        do), and its cause without host and rank ("exit code 1: <stderr's last line>"). What
        follows is the lifecycle's and the restart budget's to decide."""
        h = self._known_host(host_id)
        check_exit(self.settings, replica_id, exit_code, signal, version)
        stderr_tail = stderr_tail[-4 * self.settings.max_reason_chars:]  # only the last line is kept
        how = f"signal {signal}" if signal else f"exit code {exit_code}"
        if version and version < h.assignment_version:
            h.last_seen = now
            self._announce(now, "host", host_id,
                           f"host {host_id}: trainer rank {rank} of replica {replica_id} started under version "
                           f"{version} exited ({how}); the host runs version {h.assignment_version} already: "
                           f"nothing to do")
            return "", ""
        if h.assignment is None or h.assignment.replica_id != replica_id or rank not in h.assignment.ranks:
            raise FailedPrecondition(
                f"host {host_id} does not run replica {replica_id!r} rank {rank}; "
                f"it runs {h.assignment.describe() if h.assignment else 'nothing'}."
            )
        # A process killed outright (SIGKILL 9, SIGTERM 15) wrote no last words: its last line is
        # whatever it logged before, unrelated to the death, so it is not quoted as the reason.
        tail = stderr_tail.strip().splitlines()[-1:] if stderr_tail and signal not in (9, 15) else []
        h.last_seen = now
        last = f": {clip_text(tail[0], 200)}" if tail else ""
        return f"trainer rank {rank} on host {host_id} died ({how}){last}", f"{how}{last}"

    def replace(self, host_id: str, reason: str, now: float) -> None:
        """Cordon the host after a failure and move its work to a spare."""
        h = self.hosts[host_id]
        self._cordon(h, "failure", reason, now)
        self._swap(h, now)

    def deregister_agent(self, host_id: str, incarnation: str, reason: str,
                         now: float) -> tuple[str, list[KillReplica]]:
        """A cleanly stopping agent leaves: its host is DEAD at once (not cordoned: nothing is
        wrong with it), its work moves to a spare or its replica is marked down, and a new
        agent process may register the host right away. Returns what happened, in a line, and
        what it asks of the host's replica."""
        h = self._known_host(host_id)
        check_id("incarnation", incarnation, self.settings.max_id_chars)
        if incarnation != h.incarnation:
            raise FailedPrecondition(f"host {host_id} is registered by incarnation {h.incarnation!r}, not "
                                     f"{shown(incarnation)}: only the registered agent may deregister it.")
        why = f"its agent stopped: {clip_text(reason, self.settings.max_reason_chars) or 'no reason given'}"
        if h.state == HostState.DEAD:
            return f"host {host_id} had left already", []
        move_host(h, HostState.DEAD)
        self.touch(h, urgent=True)
        self._announce(now, "host_left", host_id, f"host {host_id} left: {why}")
        if h.assignment is not None:
            kill = KillReplica(h.assignment.replica_id, DeathCause.HOST, f"host {host_id} left: {why}")
            return self._move_line(h), [kill, MoveWork(host_id)]
        return f"host {host_id} left the spare pool", []

    def ack_order(self, host_id: str, order_id: str, ok: bool, error: str, now: float) -> None:
        self._known_host(host_id)
        check_id("order_id", order_id, self.settings.max_id_chars)
        if not ok:
            error = clip_text(error, self.settings.max_reason_chars) or "no reason given"
            self._announce(now, "order_failed", host_id, f"host {host_id} refused order {order_id}: {error}")

    def orders_on_connect(self, host_id: str, pending: OrderOut | None) -> list[OrderOut]:
        """What a host whose order stream (re)opens is sent: its current assignment (maybe
        none), never a replay. An undelivered RESTART or START still stands if no later
        decision changed the host's assignment; anything else undelivered is superseded."""
        h = self._known_host(host_id)
        out = [self._new_order(h, "CURRENT", h.assignment, "the current assignment of a (re)connecting host")]
        if pending is not None and pending.kind in ("RESTART", "START") and pending.version == h.assignment_version:
            out.append(pending)
        return out

    def is_superseded(self, order: OrderOut) -> bool:
        """A later decision changed the recipient's assignment since `order` was made."""
        h = self.hosts.get(order.host_id)
        return h is None or order.version < h.assignment_version
    def authenticate_agent(self, host_id: str, secret: str) -> Host:
        """The host, if `secret` is the one its agent was given at registration."""
        h = self._known_host(host_id)
        if not secret_matches(h.secret_hash, secret):
            raise PermissionDenied(
                f"host {host_id}: the agent secret is {'missing' if not secret else 'wrong'}; only the agent "
                f"that registered this host may act for it (register to get a secret).")
        return h

    # -- operator actions --------------------------------------------------------------------

    def drain(self, host_id: str, now: float) -> tuple[str, list[KillReplica]]:
        return self.evict(host_id, "admin", "drained by an operator", now, what="drain")

    def evict(self, host_id: str, by: str, reason: str, now: float,
              what: str = "evict") -> tuple[str, list[KillReplica]]:
        """Move a host's work onto a spare and keep the host out: cordoned by `by` ("admin" and
        "diagnosis" cordons survive re-registration), its replica rebuilt on the spare (the
        returned intent takes it out first: it restarts on the spare). Returns what happened."""
        h = self._known_host(host_id)
        if h.assignment is None:
            raise FailedPrecondition(f"host {host_id} runs nothing; there is nothing to {what}.")
        choice = pick_spare(h, list(self.hosts.values()))
        if choice.host_id is None:
            raise FailedPrecondition(f"cannot {what} host {host_id}: {choice.reason}.")
        self._cordon(h, by, reason, now)
        kill = KillReplica(h.assignment.replica_id, DeathCause.HOST, f"host {host_id} is being {what}ed")
        return self._move_line(h), [kill, MoveWork(host_id)]

    def cordon(self, host_id: str, reason: str, now: float) -> None:
        self._cordon(self._known_host(host_id), "admin", reason or "cordoned by an operator", now)

    def uncordon(self, host_id: str, now: float) -> None:
        h = self._known_host(host_id)
        if h.cordoned:
            h.cordoned, h.cordon_reason, h.cordon_by = False, "", ""
            self.touch(h, urgent=True)
            self._announce(now, "host", host_id, f"host {host_id} uncordoned")
            if h.state == HostState.SPARE:
                self._fill_orphans(now)

    # -- internals ---------------------------------------------------------------------------

    def _known_host(self, host_id: str) -> Host:
        check_id("host_id", host_id, self.settings.max_id_chars)
        h = self.hosts.get(host_id)
        if h is None:
            raise NotFound(f"host {host_id!r} is unknown: its agent must register first.")
        return h

    def _add_host(self, h: Host) -> Host:
        self.hosts[h.host_id] = h
        self.shards.add(h.host_id)
        return h

    def encoded_host_shard(self, shard: int) -> bytes:
        """A host shard's bytes in the store, as encode_section(snapshot_hosts(shard)) would
        make them (controller.core.host_records)."""
        return self.shards.encoded(shard, self.hosts)

    def _holder(self, a: Assignment, exclude: str) -> str | None:
        for rank in a.ranks:
            holder = self.rank_holders.get((a.replica_id, rank))
            if holder is not None and holder != exclude:
                return holder
        return None

    def _assign(self, h: Host, a: Assignment | None, urgent: bool = True) -> None:
        """Decide a host's assignment: a new version for the host and for the replicas it
        leaves and joins."""
        version = self._next_version()
        for old_or_new in (h.assignment, a):
            if old_or_new is not None:
                self.replica_versions[old_or_new.replica_id] = version
        h.assignment_version = version
        self._index(h, a)
        self.touch(h, urgent=urgent)

    def _index(self, h: Host, a: Assignment | None) -> None:
        """Set a host's assignment, keeping the (replica, rank) -> host index true."""
        if h.assignment is not None:
            for rank in h.assignment.ranks:
                if self.rank_holders.get((h.assignment.replica_id, rank)) == h.host_id:
                    del self.rank_holders[(h.assignment.replica_id, rank)]
        h.assignment = a
        if a is not None:
            for rank in a.ranks:
                self.rank_holders[(a.replica_id, rank)] = h.host_id

    def touch(self, h: Host, urgent: bool = False) -> None:
        """Mark the host's snapshot shard for writing; urgent changes are written before
        the request that made them is answered, the rest within a tick."""
        self._writes.mark(host_section(host_shard(h.host_id)), urgent)
        self.shards.changed(h.host_id)

    def _cordon(self, h: Host, by: str, reason: str, now: float) -> None:
        h.cordoned, h.cordon_reason, h.cordon_by = True, clip_text(reason, MAX_CORDON_REASON_CHARS), by
        self.touch(h, urgent=True)
        self._announce(now, "cordon", h.host_id, f"host {h.host_id} cordoned: {reason}")

    def _host_died(self, h: Host, why: str, now: float) -> list[KillReplica]:
        move_host(h, HostState.DEAD)
        self.touch(h, urgent=True)
        self._announce(now, "host_death", h.host_id, f"host {h.host_id} died: {why}", "heartbeat")
        if h.assignment is None:
            return []
        if not h.cordoned:
            self._cordon(h, "failure", why, now)
        return [KillReplica(h.assignment.replica_id, DeathCause.HOST, f"host {h.host_id} died: {why}"),
                MoveWork(h.host_id)]

    def move_work(self, host_id: str, now: float) -> str:
        """Carry out a MoveWork intent (a host's death, departure or eviction decided it)."""
        return self._swap(self.hosts[host_id], now)

    def _move_line(self, failed: Host) -> str:
        """What moving `failed`'s work will do, in the words `_swap` announces it."""
        choice = pick_spare(failed, list(self.hosts.values()))
        if choice.host_id is None or failed.assignment is None:
            return choice.reason
        return _swap_line(choice.host_id, failed.assignment, failed.host_id, choice.reason)

    def _swap(self, failed: Host, now: float) -> str:
        """Move `failed`'s assignment to a spare and restart the replica around it (its other
        hosts restart their ranks under the spare's new version). Without a spare the replica's
        other hosts are stopped: it is down until a spare or the host comes back."""
        a = failed.assignment
        choice = pick_spare(failed, list(self.hosts.values()))
        if a is None or choice.host_id is None:
            self._announce(now, "no_spare", failed.host_id,
                           f"{choice.reason}; {a.describe() if a else 'nothing'} stays out until one is free")
            if a is not None:
                with self.outbox.batch() as orders:
                    self.restart_replica(a.replica_id, f"host {failed.host_id} failed and {choice.reason}")
                self.announce_orders(orders, now)
            return choice.reason
        spare = self.hosts[choice.host_id]
        self._assign(failed, None)
        self._assign(spare, a)
        move_host(spare, HostState.ACTIVE)
        if failed.state != HostState.DEAD:
            move_host(failed, HostState.SPARE)
        with self.outbox.batch() as orders:
            # A dead host is told too: if its agent still listens (it was only slow), it stops now;
            # if not, it learns its (empty) assignment when it reconnects.
            self._order(failed.host_id, "STOP", None, f"its work moved to host {spare.host_id}")
            self._order(spare.host_id, "ASSIGN", a, f"replaces host {failed.host_id}: {choice.reason}")
            self.restart_replica(a.replica_id, f"rebuilds after host {failed.host_id} failed", skip=spare,
                                 version=spare.assignment_version)
        self.swaps += 1
        self._writes.mark(REPLICAS)
        because = failed.cordon_reason if failed.cordoned else f"host {failed.host_id} is {failed.state.name}"
        why = f"{_swap_line(spare.host_id, a, failed.host_id, choice.reason)}: {because}"
        self._announce(now, "swap", failed.host_id, why)
        self.announce_orders(orders, now)
        return why

    def announce_orders(self, orders: list[OrderOut], now: float) -> None:
        """One event for the orders of one decision (a replica of 1,000 hosts is restarted by
        one line, not 1,000): those an `outbox.batch()` collected."""
        if orders:
            self._announce(now, "order", orders[0].host_id, orders_summary(orders))

    def _fill_orphans(self, now: float) -> None:
        """A spare arrived: give it work that waits on a dead or cordoned host."""
        for h in sorted(self.hosts.values(), key=lambda h: h.host_id):
            if h.assignment is not None and (h.state == HostState.DEAD or h.cordon_by == "failure"):
                if pick_spare(h, list(self.hosts.values())).host_id is None:
                    return
                self._swap(h, now)

    def _order(self, host_id: str, kind: str, a: Assignment | None, reason: str) -> None:
        self.outbox.put(self._new_order(self.hosts[host_id], kind, a, reason))

    def _new_order(self, h: Host, kind: str, a: Assignment | None, reason: str) -> OrderOut:
        meet = self.replica_endpoints(a.replica_id) if a else Endpoints()
        return OrderOut(h.host_id, self.outbox.next_id(), kind, a, reason, version=h.assignment_version,
                        replica_version=self.replica_versions.get(a.replica_id, 0) if a else 0,
                        rendezvous_address=meet.rendezvous, coordinator_address=meet.coordinator)

    def replica_endpoints(self, replica_id: str) -> Endpoints:
        """Where the replica's ranks meet: its rank-0 host's registered address and ports."""
        holder = self.hosts.get(self.rank_holders.get((replica_id, 0), ""))
        if holder is None:
            return Endpoints()
        return endpoints(holder.address, holder.rendezvous_port, holder.coordinator_port)

    def replica_hosts(self, replica_id: str) -> list[Host]:
        """The hosts that hold ranks of the replica, by their lowest rank."""
        holders = {h for (rid, _), h in self.rank_holders.items() if rid == replica_id}
        hosts = [self.hosts[h] for h in holders]
        return sorted(hosts, key=lambda h: min(h.assignment.ranks))

    def restart_replica(self, replica_id: str, why: str, *, skip: Host | None = None,
                        version: int | None = None) -> int:
        """Order every host of the replica (but `skip`, which learns it otherwise) to restart
        its ranks together, under one new replica version (`version`: one already decided for
        the replica, e.g. the spare's ASSIGN). If a host of the replica cannot run, stop the
        others instead: the replica is down until that host is replaced or back. Returns how
        many hosts restart (0: the replica is down). The caller collects the orders in an
        `outbox.batch()` and announces them (`announce_orders`)."""
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
            self.touch(h, urgent=True)
        for h in hosts:
            if h is not skip:
                self._order(h.host_id, "RESTART", h.assignment, f"replica {replica_id} restarts as a unit: {why}")
        return len(hosts)

    def _next_version(self) -> int:
        """The next assignment version. The persisted ceiling runs ahead of it in blocks, so a
        new leader starts above every version given before without a write per decision."""
        self.assignment_seq += 1
        if self.assignment_seq > self.version_ceiling:
            self.version_ceiling = self.assignment_seq + VERSION_BLOCK
            self._writes.mark(REPLICAS)
        return self.assignment_seq

    def restore(self, replicas: dict | None, host_shards: list[dict | None], now: float) -> None:
        """Load what a previous leader wrote: the counters of the replicas section (None: an
        empty store, count from the clock in ms, so agents that outlive a controller without a
        durable store never see a version or an order id go back) and the host shards."""
        if not replicas:
            self.version_ceiling = int(now * 1000)
            self.outbox.restore(self.version_ceiling)
        else:
            self.swaps = replicas["swaps"]
            # Order ids must never repeat (agents answer a repeated id from memory), and the
            # counter is written only now and then: continue from the clock if it is ahead.
            self.outbox.restore(max(replicas["order_seq"], int(now * 1000)))
            self.version_ceiling = replicas.get("version_ceiling", 0)
            self.replica_versions = dict(replicas.get("replica_versions", {}))
        for shard in host_shards:
            for d in (shard or {}).get("hosts", ()):
                a = d["assignment"]
                h = self._add_host(Host(**dict(d, state=HostState(d["state"]), last_seen=now, assignment=None)))
                if a:
                    self._index(h, Assignment(a[0], tuple(a[1]), a[2]))
                    rid = a[0]
                    self.replica_versions[rid] = max(self.replica_versions.get(rid, 0), h.assignment_version)
                self.version_ceiling = max(self.version_ceiling, h.assignment_version)
        # Every version given before this point is at most the ceiling: continue above it.
        self.assignment_seq = self.version_ceiling
        for h in self.hosts.values():
            self.shards.reserve(h, self.settings)


def _swap_line(spare_id: str, a: Assignment, failed_id: str, reason: str) -> str:
    return f"host {spare_id} takes {a.describe()} from host {failed_id} ({reason})"
