"""The replica restarts as a unit: when one of its trainers dies, all of its ranks restart.

A replica's ranks are one torch.distributed group spread over its hosts: when one rank dies,
the others cannot go on (their next collective fails on a reset connection), so restarting
the dead rank alone only lets the survivors crash one by one. Instead the controller restarts
the whole replica, like TorchElastic's worker group: every host of the replica gets a RESTART
order that stops and starts its ranks together. A replica restart is a new replica version
(controller.core.hosts): each host of the replica gets the same new assignment version, so
exits of the trainers it replaces (survivors that crashed before their order arrived) are
known as old (TrainerExitRequest.version) and restart nothing again.

The restart budget counts replica restarts, charged to the host whose trainer died: at most
`restart_budget` within `restart_window_s`; the next death replaces that host by a spare
(cordoned, its work moved, the replica rebuilt around the spare). A replica with a host that
cannot run (DEAD, or cordoned after a failure and waiting for a spare) does not restart: its
other hosts are stopped, and it restarts when the host is replaced or comes back.

`restart_decision` is the pure rule; `ReplicaRestarts` (a mixin of ControllerState) applies it.
Time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.model import Host, host_can_run
from controller.core.pending_writes import REPLICAS


@dataclass(frozen=True)
class RestartDecision:
    #: True: replace the host (budget spent); False: restart the replica in place.
    replace_host: bool
    reason: str


def restart_decision(restart_times_s: list[float], now: float, budget: int, window_s: float) -> RestartDecision:
    """After a trainer death on a host whose earlier deaths restarted its replica at
    `restart_times_s`: restart again, or replace the host."""
    used = sum(1 for t in restart_times_s if now - window_s < t <= now)
    if used >= budget:
        return RestartDecision(True, f"restart budget exhausted: {used} replica restart(s) in the last "
                                     f"{window_s:g} s, budget {budget}")
    return RestartDecision(False, f"replica restart {used + 1} of {budget} allowed per {window_s:g} s")


class ReplicaRestarts:
    """Mixin of ControllerState: restarting a replica's ranks together on its hosts."""

    def replica_hosts(self, replica_id: str) -> list[Host]:
        """The hosts that hold ranks of the replica, by their lowest rank."""
        holders = {h for (rid, _), h in self.rank_holders.items() if rid == replica_id}
        hosts = [self.hosts[h] for h in holders]
        return sorted(hosts, key=lambda h: min(h.assignment.ranks))

    def restart_after_death(self, h: Host, why: str, now: float) -> None:
        """One of `h`'s trainers died: restart its replica in place, or replace `h` when its
        restart budget is spent."""
        s = self.settings
        decision = restart_decision(h.restart_times_s, now, s.restart_budget, s.restart_window_s)
        if decision.replace_host:
            self._cordon(h, "failure", f"{decision.reason}: {why}", now)
            self._swap(h, now)
            return
        h.restart_times_s = [t for t in h.restart_times_s if now - s.restart_window_s < t] + [now]
        rid, first = h.assignment.replica_id, len(self.outbox)
        restarted = self.restart_replica(rid, f"{why} ({decision.reason})")
        if restarted:
            r = self.replicas.get(rid)
            if r is not None:
                r.restarts += 1
                self.writes.mark(REPLICAS)
            self._event(now, "replica_restart", rid,
                        f"replica {rid} restarts its ranks on {restarted} host(s) together: {why} ({decision.reason})")
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
