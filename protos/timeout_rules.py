"""The timeout hierarchy as data: every timeout of the controller, the agent and the trainer
runtime, which wait each bounds, and the rules that say which must exceed which and why.

A rule is (larger, smaller, factor, why): `larger >= factor * sum(smaller)`. Values are named
`process.field` (`controller.join_timeout_s`, `agent.heartbeat_interval_s`,
`runtime.gather_timeout_s`), the field names of ControllerSettings (diagnosis fields as
`controller.diagnosis.NAME`), AgentSettings and RuntimeSettings. `check(values)` judges the
rules whose values are all given: each process checks its own values when it starts
(ControllerSettings / AgentSettings / RuntimeSettings .validate()); the rules that span
processes are checked where one configuration holds all of them: `fthsdp timeouts`, and the
demo's launcher. docs/operations.md ("Timeouts") draws the same hierarchy for people.

The controller, the agent and the runtime all read this module and none may import another
(pyproject.toml's import contracts), so it sits beside the wire contract, as protos/dial.py
does. Pure: no I/O, no clock, nothing of ours imported.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Iterable, Mapping

CONTROLLER, AGENT, RUNTIME = "controller", "agent", "runtime"
PROCESSES = (CONTROLLER, AGENT, RUNTIME)

#: Every timeout, by name: the wait it bounds. The defaults are the settings classes' own.
WAITS: dict[str, str] = {
    # controller
    "controller.join_timeout_s": "a quorum round waits this long for live replicas that have not joined, "
                                 "from its first joiner",
    "controller.heartbeat_timeout_s": "a replica coordinator or agent silent this long is declared dead",
    "controller.rollback_wait_s": "a round whose members all lack the newest committed step waits this long "
                                  "for its holders before it rolls back (0: no wait)",
    "controller.fail_after_s": "the job becomes FAILED once no replica could make progress for this long",
    "controller.lease_ttl_s": "a standby takes over this long after the leader stopped renewing its lease",
    "controller.store_failing_s_to_step_down": "the leader steps down once store writes kept failing this long",
    "controller.client_backoff_cap_s": "what the controller assumes of its clients: the longest pause "
                                       "between two passes over the controller addresses",
    "controller.client_call_s": "what the controller assumes: how long its answer to a reconnecting "
                                "client's first call may take",
    "controller.client_timeout_s": "what the controller assumes: how long a client waits on a controller "
                                   "that does not answer before it tries the next address",
    "controller.digest_wait_s": "a step's digest comparison waits this long for the other replicas",
    "controller.quorum_port_hello_s": "a quorum port connection must send its first join within this",
    "controller.quorum_port_frame_s": "a begun frame on the quorum port must finish within this",
    "controller.stop_grace_s": "in-flight calls get this long when the controller stops",
    "controller.diagnosis.hang_after_s": "a collective some rank joined this long ago and nobody completed "
                                         "is a hang",
    "controller.diagnosis.analysis_interval_s": "the hang analysis runs this often",
    "controller.diagnosis.telemetry_stale_s": "a rank whose last telemetry is older than this is silent",
    "controller.diagnosis.startup_grace_s": "a rank that has completed no collective yet is not judged for "
                                            "this long",
    "controller.diagnosis.straggler_window_wait_s": "a straggler window waits this long for all its members",
    # agent
    "agent.heartbeat_interval_s": "the agent beats this often on its heartbeat stream",
    "agent.rpc_timeout_s": "one call to the controller (or a heartbeat stream without answer) gives up "
                           "after this and reconnects",
    "agent.connect_timeout_s": "the agent exits 5 once no controller address answered its first registration "
                               "for this long",
    "agent.reconnect_timeout_s": "the same once a controller had answered (a failover or restart may take this "
                                 "long); trainers that trained are kept up to twice this while it retries",
    "agent.finish_grace_s": "once the job is COMPLETED, a trainer may finish its own work after Manager.close() "
                            "and exit on its own for this long before it is stopped",
    "agent.reconnect_base_s": "the first pause after a whole pass over the addresses failed",
    "agent.reconnect_cap_s": "the longest pause between two passes over the addresses",
    "agent.stop_grace_s": "a stopped trainer gets SIGKILL this long after SIGTERM",
    "agent.poll_interval_s": "the supervisor looks at its processes at least this often",
    "agent.reserve_delay_s": "a warm reserve starts this long after its trainer",
    "agent.telemetry_interval_s": "the agent sends its trainers' collective telemetry this often (0: off)",
    # runtime
    "runtime.quorum_timeout_s": "the coordinator waits this long for one quorum answer (and ranks this long "
                                "to reach the coordinator at start)",
    "runtime.gather_timeout_s": "after the first rank's begin, vote or digest of a round, the coordinator "
                                "waits this long for every other rank's; silence is a no",
    "runtime.allreduce_timeout_s": "one FTAR all-reduce (every socket wait in it); past it the step's vote is no",
    "runtime.fetch_timeout_s": "one catch-up fetch attempt",
    "runtime.fetch_hold_timeout_s": "a catch-up source holds its optimizer step this long for its fetchers",
    "runtime.hello_timeout_s": "a connection to a trainer port must authenticate within this",
    "runtime.heartbeat_interval_s": "rank 0 beats this often for its replica",
    "runtime.controller_heartbeat_timeout_s": "the controller's heartbeat_timeout_s as this replica assumes it "
                                              "(the runtime cannot ask the controller)",
    "runtime.connect_timeout_s": "rank 0 ends the replica (ControllerUnreachable) once no controller answered "
                                 "its first call for this long",
    "runtime.reconnect_timeout_s": "the same once a controller had answered (a failover or restart may take "
                                   "this long)",
}


@dataclass(frozen=True)
class Rule:
    """`larger` must be at least `factor` times the sum of `smaller`, because `why`."""

    larger: str
    smaller: tuple[str, ...]
    factor: float
    why: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.larger, *self.smaller)

    @property
    def processes(self) -> frozenset[str]:
        return frozenset(process_of(name) for name in self.names)

    def text(self, local: str = "") -> str:
        """`larger >= factor × smaller`, names without the prefix `local` ("controller.")."""
        smaller = " + ".join(_short(n, local) for n in self.smaller)
        if len(self.smaller) > 1 and self.factor != 1:
            smaller = f"({smaller})"
        return f"{_short(self.larger, local)} >= {'' if self.factor == 1 else f'{self.factor:g} × '}{smaller}"


@dataclass(frozen=True)
class Violation:
    rule: Rule
    larger_s: float
    #: the smaller side: factor × the sum of the smaller values
    smaller_s: float
    #: the smaller values, in the rule's order
    values: tuple[float, ...]

    def message(self, local: str = "") -> str:
        """One sentence naming both sides and their values (names without the `local` prefix)."""
        r = self.rule
        parts = " + ".join(f"{_short(n, local)} ({v:g} s)" for n, v in zip(r.smaller, self.values))
        scaled = parts if r.factor == 1 else f"{r.factor:g} × {parts if len(r.smaller) == 1 else f'({parts})'}"
        total = f" = {self.smaller_s:g} s" if r.factor != 1 or len(r.smaller) > 1 else ""
        return (f"{_short(r.larger, local)} ({self.larger_s:g} s) must be at least {scaled}{total}: {r.why}.")

    def __str__(self) -> str:
        return self.message()


# Each rule once. The smaller side is what the larger must outlast.
RULES: tuple[Rule, ...] = (
    # -- inside the controller
    Rule("controller.heartbeat_timeout_s", ("controller.client_backoff_cap_s", "controller.client_call_s"), 1,
         "a live client that lost its connection reconnects within one capped pause and one answered call; "
         "a shorter heartbeat timeout declares it dead while it reconnects (raise the timeout or lower the "
         "clients' backoff cap)"),
    # -- inside the agent
    Rule("agent.rpc_timeout_s", ("agent.heartbeat_interval_s",), 2,
         "the controller answers each beat; a stream silent for rpc_timeout_s counts as a failed controller, "
         "so one late answer must not fail it"),
    Rule("agent.reconnect_cap_s", ("agent.reconnect_base_s",), 1,
         "the backoff starts at reconnect_base_s and doubles up to the cap"),
    # -- inside the runtime
    Rule("runtime.gather_timeout_s", ("runtime.allreduce_timeout_s",), 1,
         "a rank votes once its all-reduce ended, and the ranks of a replica run different rings: a vote may "
         "follow the first by up to the all-reduce timeout, and a shorter gather counts a rank whose "
         "all-reduce still succeeds as a no (every slow step retried)"),
    Rule("runtime.controller_heartbeat_timeout_s", ("runtime.heartbeat_interval_s",), 3,
         "the controller declares a replica dead after its heartbeat timeout of silence: two lost or late "
         "beats must not kill it (set FTHSDP_CONTROLLER_HEARTBEAT_TIMEOUT_S to the controller's "
         "--heartbeat-timeout-s)"),
    # -- across processes: checked by `fthsdp timeouts` on a whole configuration
    Rule("controller.heartbeat_timeout_s", ("agent.heartbeat_interval_s",), 3,
         "two lost or late beats of an agent must not declare its host dead"),
    Rule("controller.heartbeat_timeout_s", ("runtime.heartbeat_interval_s",), 3,
         "two lost or late beats of a replica's rank 0 must not declare the replica dead"),
    Rule("controller.client_timeout_s", ("agent.rpc_timeout_s",), 1,
         "after a takeover the controller forgives silence for client_timeout_s + a reconnect cycle; an agent "
         "that waits longer on a frozen leader is declared dead while it still waits"),
    Rule("controller.client_backoff_cap_s", ("agent.reconnect_cap_s",), 1,
         "the heartbeat timeout and the takeover grace cover one pause of client_backoff_cap_s; an agent that "
         "pauses longer between passes is declared dead while it pauses"),
    Rule("runtime.quorum_timeout_s", ("controller.join_timeout_s", "controller.rollback_wait_s"), 1,
         "the controller may hold a round for its join timeout and then for the rollback wait before it "
         "answers; a coordinator that gives up sooner retries a round that was about to close"),
    Rule("runtime.allreduce_timeout_s", ("controller.diagnosis.hang_after_s",
                                          "controller.diagnosis.analysis_interval_s"), 1,
         "the diagnosis must see a stuck collective before the peers' all-reduces give up on it; after "
         "that only the hung rank is left waiting and nothing shows where the hang is"),
    Rule("controller.diagnosis.telemetry_stale_s", ("agent.telemetry_interval_s",), 2,
         "the agents report telemetry every telemetry_interval_s; a rank is silent only when a report is "
         "more than one interval late"),
)


def process_of(name: str) -> str:
    process = name.split(".", 1)[0]
    if process not in PROCESSES:
        raise ValueError(f"timeout name {name!r} does not start with one of {', '.join(PROCESSES)}.")
    return process


def _short(name: str, local: str) -> str:
    return name[len(local) + 1:] if local and name.startswith(local + ".") else name


def check(values: Mapping[str, float], rules: Iterable[Rule] = RULES) -> list[Violation]:
    """The rules broken by `values` (name -> seconds); a rule with a value missing is not judged.
    A value that is not a finite number is left to the settings' own validation."""
    broken = []
    for rule in rules:
        given = [values.get(n) for n in rule.names]
        if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in given):
            continue
        larger, smaller = given[0], rule.factor * sum(given[1:])
        if larger < smaller:
            broken.append(Violation(rule, larger, smaller, tuple(given[1:])))
    return broken


def qualified(process: str, values: Mapping[str, float]) -> dict[str, float]:
    """`values` named by field ("join_timeout_s") as `process.field`."""
    return {f"{process}.{name}": value for name, value in values.items()}


def problems(process: str, values: Mapping[str, float]) -> list[str]:
    """The broken rules among one process's own values (field names), as sentences naming
    both values without the process prefix: what its settings' validate() reports."""
    return [v.message(process) for v in check(qualified(process, values))]


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0, else an error naming the text."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value
