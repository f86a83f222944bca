"""The chaos schedule's composed faults (tests/chaos/schedule.py): two faults in an order that
matters, the second timed by what the first did. Each function carries out the first action on
a ChaosRun and returns the follow-up, as ChaosRun._inject does: now -> (next or None, poll fast).

- swap_then_kill_controller: kill the replica's host; once the spare holds the replica and it
  is HEALTHY again, SIGKILL the active controller (the chaos finding of issue 28: the spare
  registers again carrying its new work). No death may follow the controller kill
  (`Injection.quiet_after`).
- kill_controller_catching_up: kill the replica's leader; once its restarted rank `rank`
  records that it catches up from a source, SIGKILL the active controller.
- kill_host_in_grace: SIGKILL the active controller; once another one took over (its "grace"
  event), kill the replica's host while the grace forgives silence.

The killed controller comes back after `down_s`, counted from its kill, as kill_controller.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from fthsdp.demo import procs
from tests.chaos.schedule import Fault

if TYPE_CHECKING:
    from tests.chaos.executor import ChaosRun, Injection


def kill_active_controller(run: "ChaosRun", inj: "Injection", down_s: float):
    """SIGKILL the leading controller now; the follow-up restarts it `down_s` later."""
    leader, _ = run._leader()
    if leader is None:
        raise RuntimeError("no controller leads: cannot kill the active one")
    leader.signal(signal.SIGKILL)
    leader.proc.wait(10)
    killed_at = inj.controller_killed_at = time.time()
    inj.controller = leader.name
    inj.detail.append(f"SIGKILL controller {leader.name} (pid {leader.proc.pid}), back in {down_s:g}s")

    def restart(now: float):
        if now < killed_at + down_s:
            return restart, False
        leader.start()
        inj.detail.append(f"controller {leader.name} restarted (pid {leader.proc.pid})")
        return None, False
    return restart


def kill_host(run: "ChaosRun", inj: "Injection", rid: str) -> str:
    host = run._host_of(rid)
    under = procs.kill_host(run.agents.pop(host))
    run._touch(inj, rid)
    inj.hosts.append(host)
    inj.detail.append(f"SIGKILL host {host}: its agent and {len(under)} process(es) under it")
    return host


def swap_then_kill_controller(run: "ChaosRun", f: Fault, inj: "Injection"):
    rid = f.replicas[0]
    old = kill_host(run, inj, rid)

    def when_swapped(now: float):
        holder = next((h["host_id"] for h in run.view.get("hosts", []) if h["state"] == "ACTIVE"
                       and h["assignment"] and h["assignment"]["replica_id"] == rid), None)
        healthy = run.view.get("replicas", {}).get(rid, {}).get("state") == "HEALTHY"
        if holder in (None, old) or not healthy or not run._settled_replica(inj, rid):
            return when_swapped, False
        inj.detail.append(f"{rid} runs on {holder} now")
        restart = kill_active_controller(run, inj, f.down_s)
        inj.quiet_after = inj.controller_killed_at
        return restart, False
    return when_swapped


def kill_controller_catching_up(run: "ChaosRun", f: Fault, inj: "Injection"):
    rid = f.replicas[0]
    killed = {k: run._pid(rid, k) for k in range(run.s.ranks)}
    run._kill(inj, rid, 0)

    def catching_up(now: float):  # polled closely: the catch-up step takes about min_step_s
        row, committed = run._catch_up(rid, f.rank, killed[f.rank])
        if row is None and not committed:
            return catching_up, True
        inj.detail.append(f"{rid} rank {f.rank} " + (f"catching up at step {row['step']} from {row['source']}"
                                                      if row else "committed without catching up first"))
        return kill_active_controller(run, inj, f.down_s), False
    return catching_up


def kill_host_in_grace(run: "ChaosRun", f: Fault, inj: "Injection"):
    rid = f.replicas[0]
    restart = kill_active_controller(run, inj, f.down_s)
    killed_at = inj.controller_killed_at
    pending = {"restart": restart, "host": True}

    def both(now: float):
        if pending["restart"] is not None:
            pending["restart"], _ = pending["restart"](now)
        if pending["host"]:
            grace = [e for e in run.events.values() if e["kind"] == "grace" and e["at"] >= killed_at]
            if grace and run.view.get("hosts"):
                inj.detail.append(f"a new leader's grace began {now - grace[0]['at']:.2f}s ago")
                kill_host(run, inj, rid)
                pending["host"] = False
        return (None if pending["restart"] is None and not pending["host"] else both), False
    return both
