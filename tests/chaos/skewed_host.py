"""The network chaos kind `skewed_host`: a host whose clock is off joins the running job.

A new host node (`NODE`) joins the test network and its agent registers as a spare with its
clock (and its children's) shifted by the fault's `skew_s` (libfaketime, tests/chaos/
net_faults.py `skewed_clock`). Registration proofs carry the agent's time and the controller
accepts them within REGISTRATION_WINDOW_S (300 s) of its own clock, so:

| skew            | expected                                                             |
|-----------------|----------------------------------------------------------------------|
| beyond 300 s    | the agent is refused and exits 3, its log naming the skew and its    |
|                 | side ("412s ahead of this controller's clock"); it never is a host   |
| within 300 s    | nothing changes: the agent registers, its host is a SPARE and stays  |
|                 | heard (heartbeats) past twice the heartbeat timeout; then it stops   |
|                 | cleanly (it leaves the spare pool: nobody dies)                      |

Neither touches a replica: the job trains on (the stall bound holds). What the agent did is
recorded in `Injection.observed`, and `violations(inj)` (the invariants call it) says what
differs from the table. Every wait is bounded by the settings' fault timeout.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from fthsdp.demo import procs
from protos.credentials import REGISTRATION_WINDOW_S
from tests.chaos.net_faults import skewed_clock

if TYPE_CHECKING:
    from tests.chaos.executor import ChaosRun, Injection
    from tests.chaos.schedule import Fault

NODE = "skew0"
KIND = "skewed_host"
REFUSED_EXIT = 3  # the agent's exit code for a refused registration (agent.refusals)
_NAMED = re.compile(r"(\d+)s (ahead of|behind) this controller's clock")
#: how far the skew the controller names may be from the one set (rounding, the proof's age)
NAMED_WITHIN_S = 3.0


def beyond(skew_s: float) -> bool:
    return abs(skew_s) > REGISTRATION_WINDOW_S


def join(run: "ChaosRun", f: "Fault", inj: "Injection"):
    """Start the skewed agent now; the follow-up watches it until the table's outcome is seen
    (or its bound passes), records it, and stops the agent."""
    net = run.net
    if NODE not in net.nodes:
        net.add(NODE)
    log = run.workdir / f"agent-{NODE}.log"
    agent = run.start_spare_agent(NODE, log, skewed_clock(f.skew_s))
    started = time.time()
    expected = "refused" if beyond(f.skew_s) else "registered"
    inj.observed.update(skew_s=f.skew_s, window_s=REGISTRATION_WINDOW_S, expected=expected,
                        heartbeat_timeout_s=run.s.heartbeat_timeout_s)
    inj.detail.append(f"agent {NODE} joins as a spare with its clock {f.skew_s:+.0f}s off (pid {agent.pid}); "
                      f"expected: {expected}")
    bound = started + run.s.fault_timeout_s
    registered_at: list[float] = []

    def watch(now: float):
        host = next((h for h in run.view.get("hosts", []) if h["host_id"] == NODE), None)
        exited = agent.poll()
        if host is not None and not registered_at:
            registered_at.append(now)
            inj.observed["registered_after_s"] = round(now - started, 2)
        if exited is not None or now > bound:
            return _end(run, agent, log, inj, host, exited, now > bound and exited is None), False
        if registered_at and now >= registered_at[0] + max(f.stop_s, 2 * run.s.heartbeat_timeout_s):
            return _end(run, agent, log, inj, host, None, False), False
        return watch, False
    return watch


def _end(run: "ChaosRun", agent, log, inj: "Injection", host: dict | None, exited: int | None, timed_out: bool):
    """Record what the agent did, stop it if it still runs, and end the fault (None)."""
    seen = inj.observed
    seen["exit_code"] = exited
    seen["timed_out"] = timed_out
    seen["registered"] = "registered_after_s" in seen
    if host is not None:
        seen["host_state"] = host["state"]
        seen["heard_s_ago"] = round(host.get("seconds_since_seen", -1.0), 2)
    text = log.read_text(errors="replace") if log.exists() else ""
    named = _NAMED.search(text)
    if named:
        seen["named"] = f"{named.group(1)}s {named.group(2)} this controller's clock"
    if exited is None:
        procs.stop(agent, 10.0)
        seen["stopped"] = True
    run.agents.pop(NODE, None)
    inj.detail.append(f"agent {NODE}: " + (f"exited {exited}" if exited is not None else "stopped") +
                      (f", refused: {seen['named']}" if named else ""))
    return None


def violations(inj: "Injection") -> list[str]:
    """What the skewed agent did that the table does not expect ([] when it matches)."""
    seen = inj.observed
    skew = seen.get("skew_s", 0.0)
    name = f"{inj.scheduled}: the agent with its clock {skew:+.0f}s off"
    if seen.get("timed_out"):
        return [f"{name} neither exited nor registered and held within the fault's bound"]
    if beyond(skew):
        out = []
        if seen.get("exit_code") != REFUSED_EXIT:
            out.append(f"{name} (beyond the {REGISTRATION_WINDOW_S:g}s window) was not refused: exit "
                       f"{seen.get('exit_code')}, registered {seen.get('registered')}")
        named = _NAMED.match(seen.get("named", ""))
        side = "ahead of" if skew > 0 else "behind"
        if named is None or named.group(2) != side or abs(int(named.group(1)) - abs(skew)) > NAMED_WITHIN_S:
            out.append(f"{name} was refused without naming its skew ({abs(skew):.0f}s {side}): "
                       f"{seen.get('named') or 'no skew in its log'}")
        if seen.get("registered"):
            out.append(f"{name} (beyond the window) became a host of the job")
        return out
    if not seen.get("registered") or seen.get("exit_code") is not None:
        return [f"{name} (within the {REGISTRATION_WINDOW_S:g}s window) did not register and stay: exit "
                f"{seen.get('exit_code')}, {seen.get('named') or 'no refusal in its log'}"]
    if seen.get("host_state") != "SPARE":
        return [f"{name} (within the window) registered but its host is {seen.get('host_state')}, not SPARE"]
    if not 0 <= seen.get("heard_s_ago", -1) < seen.get("heartbeat_timeout_s", 0):
        return [f"{name} (within the window) registered but was last heard {seen.get('heard_s_ago')}s ago "
                f"(heartbeat timeout {seen.get('heartbeat_timeout_s')}s)"]
    return []
