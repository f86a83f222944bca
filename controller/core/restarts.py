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

`restart_decision` is the pure rule; `RestartBudget` applies it to the restart times each
host's durable record keeps (`Host.restart_times_s`: a new leader counts on, so a crash loop
gets no fresh budget from a controller failover), returning intents (controller.core.intents):
restart the replica in place (`RestartReplica`), or replace the host (`ReplaceHost`). Time is
passed in (the controllers' wall clock, the same across a failover).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.intents import Intent, ReplaceHost, RestartReplica
from controller.core.model import Host
from controller.settings import ControllerSettings


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


class RestartBudget:
    """What the next trainer death on a host does, from the restart times its record keeps."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings

    def after_death(self, host: Host, replica_id: str, why: str, now: float) -> list[Intent]:
        """One of the host's trainers died: restart its replica in place (the time is added to
        the host's record, which the caller writes), or replace the host when its restart
        budget is spent."""
        s, times = self.settings, host.restart_times_s
        decision = restart_decision(times, now, s.restart_budget, s.restart_window_s)
        if decision.replace_host:
            return [ReplaceHost(host.host_id, f"{decision.reason}: {why}")]
        host.restart_times_s = [t for t in times if now - s.restart_window_s < t <= now] + [now]  # < budget + 1
        return [RestartReplica(replica_id, f"{why} ({decision.reason})")]
