"""The chaos test's fault schedule: pure and seeded (no I/O, no clock).

    schedule = make_schedule(7, ChaosSettings(faults=4))   # the same seed, the same schedule

Kinds of fault (the executor, tests/chaos/executor.py, carries them out on real processes):

| kind            | what is done                                                             | touches          |
|-----------------|--------------------------------------------------------------------------|------------------|
| kill_leader     | SIGKILL rank 0 of the replica (its agent restarts it)                    | the replica      |
| kill_rank       | SIGKILL a rank other than 0                                              | the replica      |
| kill_host       | SIGKILL the agent of the replica's host and every trainer under it (the  | replica and host |
|                 | controller swaps the replica to a spare)                                 |                  |
| stop_replica    | SIGSTOP every trainer of the replica for `stop_s`, past the heartbeat    | the replica      |
|                 | timeout (longer right after a takeover: past its grace too), then SIGCONT |                  |
| double_kill     | SIGKILL rank 0 of two replicas at once                                   | both replicas    |
| kill_source     | SIGKILL rank 0 of the replica, then, once it recovers from a source,     | the replica and  |
|                 | SIGKILL the source's rank `rank` (the catch-up loses its source)         | its source       |
| kill_controller | SIGKILL the active controller; it comes back as a standby on its port    | nothing else     |

Composed kinds: two faults in an order that matters, the second timed by what the first did.

| kind                      | what is done                                                   | touches          |
|---------------------------|----------------------------------------------------------------|------------------|
| swap_then_kill_controller | kill_host; once the spare holds the replica and it is HEALTHY, | replica, host,   |
|                           | kill_controller (the spare registers again with its new work:  | controller; no   |
|                           | it must keep it, nobody may die after the controller kill)     | death after it   |
| kill_controller_catching_up | kill_leader; once its restarted rank `rank` catches up from  | replica and      |
|                           | a source, kill_controller                                      | controller       |
| kill_host_in_grace        | kill_controller; once another one took over (its grace runs),  | controller,      |
|                           | kill_host (its silence counts only once the grace is over)     | replica and host |

Kinds are drawn as a seeded permutation of KINDS, taken in turn (cycling when there are more
faults than kinds), so a schedule of len(KINDS) faults has one of each; targets, ranks and
durations are drawn from the same seed. A composed kind counts as one fault. The executor injects the first fault at step
`first_fault_step`, each next one `gap_steps` commits after the job was whole again (every
replica HEALTHY) after the previous one, so faults do not pile up beyond what the kind itself
does (double kill, kill_source); the job ends `tail_steps` after the last one. At most
`spares` faults kill a host (HOST_KINDS): each one uses up a spare; one drawn with none left
becomes kill_leader.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill_leader", "kill_rank", "kill_host", "stop_replica", "double_kill", "kill_source", "kill_controller",
         "swap_then_kill_controller", "kill_controller_catching_up", "kill_host_in_grace")
#: the kinds that kill a host (each uses up a spare) and those that kill the controller
HOST_KINDS = ("kill_host", "swap_then_kill_controller", "kill_host_in_grace")
CONTROLLER_KINDS = ("kill_controller", "swap_then_kill_controller", "kill_controller_catching_up",
                    "kill_host_in_grace")


@dataclass(frozen=True)
class ChaosSettings:
    """The chaos cluster and its schedule. Times in seconds, steps as the job counts them."""
    replicas: int = 3
    ranks: int = 2
    spares: int = 1
    faults: int = 4
    first_fault_step: int = 3        # the first fault lands once the job reached this step
    gap_steps: int = 3               # ...each next one this many steps after the job was whole again
    tail_steps: int = 3              # ...and the job ends this many steps after the last one
    heartbeat_timeout_s: float = 3.0
    join_timeout_s: float = 1.0
    lease_ttl_s: float = 2.0
    rollback_wait_s: float = 4.0
    allreduce_timeout_s: float = 5.0
    stop_past_timeout_s: tuple[float, float] = (1.0, 2.5)  # SIGSTOP lasts the heartbeat timeout plus this
    controller_down_s: tuple[float, float] = (0.0, 2.0)    # a killed controller restarts this much later
    min_step_s: float = 0.1          # each step's compute takes at least this (the rest is slept)
    checkpoint_every: int = 4
    # The straggler rule's span here (the controller's diagnosis.straggler_min_span_s, 5 s by
    # default). No fault of this schedule makes a straggler, so a straggler finding here is the
    # loaded 2-core machine's noise, and its eviction takes the spare later faults count on
    # (seed 25 at load 10-14: "1.37x its group's own time in 3 of 5 windows"). At that load a
    # step takes about a second, so 5 s hold only 5 windows and 3 descheduled ones make a
    # finding; over 30 s a healthy rank is not slow in 60 % of its windows. The product's
    # default stays: a real straggler there is found in its usual 3-6 s.
    straggler_min_span_s: float = 30.0
    slack_s: float = 5.0             # a slow step or two on a loaded machine (in the stall bound)
    # A fault whose replicas are not all HEALTHY again this long after its last action (the
    # source kill of kill_source, the SIGCONT of stop_replica) is a violation. A restarted
    # trainer imports torch: seconds on an idle machine, 45 s seen at load 15 on 2 cores.
    fault_timeout_s: float = 120.0
    startup_timeout_s: float = 120.0  # the job's first steps (every trainer imports torch at once)

    @property
    def replica_ids(self) -> list[str]:
        return [f"r{i}" for i in range(self.replicas)]

    @property
    def run_timeout_s(self) -> float:
        """The bound on a whole run: its start, then each fault's own bound."""
        return self.startup_timeout_s + max(self.faults, 1) * self.fault_timeout_s

    @property
    def stall_bound_s(self) -> float:
        """The longest a replica no fault touched may go between two commits: a dead peer is
        found by the all-reduce timeout or by heartbeat silence, a dead controller is replaced
        within about its lease; the round then waits its join timeout, plus `slack_s`."""
        return max(self.allreduce_timeout_s, self.heartbeat_timeout_s, self.lease_ttl_s) + self.join_timeout_s \
            + self.slack_s

    def validate(self) -> "ChaosSettings":
        problems = []
        if self.replicas < 3:
            problems.append(f"replicas must be at least 3 (a double kill leaves one), got {self.replicas}.")
        if self.ranks < 2:
            problems.append(f"ranks must be at least 2 (kill_rank kills a rank other than 0), got {self.ranks}.")
        for name in ("spares", "faults"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative, got {getattr(self, name)}.")
        for name in ("first_fault_step", "gap_steps", "tail_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("heartbeat_timeout_s", "join_timeout_s", "lease_ttl_s", "rollback_wait_s", "allreduce_timeout_s",
                     "fault_timeout_s", "startup_timeout_s", "straggler_min_span_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be above 0 seconds, got {getattr(self, name)}.")
        for name in ("stop_past_timeout_s", "controller_down_s"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                problems.append(f"{name} must be a range (low, high) with 0 <= low <= high, got {(low, high)}.")
        if self.stop_past_timeout_s[0] <= 0:
            problems.append(f"stop_past_timeout_s must start above 0 (a SIGSTOP past the timeout), got "
                            f"{self.stop_past_timeout_s}.")
        if problems:
            raise ValueError(" ".join(problems))
        return self


@dataclass(frozen=True)
class Fault:
    kind: str                        # one of KINDS
    replicas: tuple[str, ...] = ()   # the replicas it hits (kill_source: the first one; its source is found live)
    rank: int = 0                    # kill_rank, kill_source: the rank killed (of the replica, of the source);
    #                                  kill_controller_catching_up: the rank whose catch-up is watched
    stop_s: float = 0.0              # stop_replica: how long the trainers stay stopped
    down_s: float = 0.0              # a controller kill (CONTROLLER_KINDS): how long the killed one stays down
    percent: int = 0                 # lossy_host (tests/chaos/net_kinds.py): the share of packets lost
    rate_kbit: int = 0               # capped_host: the link's rate
    delay_ms: int = 0                # slow_host: what the host sends waits this long (jitter: a fifth of it)
    skew_s: float = 0.0              # skewed_host: how far the joining host's clock is off (+: ahead)

    def describe(self) -> str:
        target = "+".join(self.replicas) or ("a new host" if self.kind == "skewed_host" else "controller")
        extra = f" rank {self.rank}" if self.kind in ("kill_rank", "kill_source", "kill_controller_catching_up") else ""
        extra += f" for {self.stop_s:.1f}s" if self.stop_s else ""
        extra += f" {self.percent}%" if self.percent else ""
        extra += f" at {self.rate_kbit} kbit/s" if self.rate_kbit else ""
        extra += f" delayed {self.delay_ms} ms" if self.delay_ms else ""
        extra += f" clock {self.skew_s:+.0f}s" if self.skew_s else ""
        return f"{self.kind}:{target}{extra}"


def make_schedule(seed: int, settings: ChaosSettings) -> tuple[Fault, ...]:
    """The faults of run `seed`, in the order they are injected."""
    s = settings.validate()
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    hosts_left = s.spares
    faults = []
    for i in range(s.faults):
        kind = kinds[i % len(kinds)]
        if kind in HOST_KINDS:
            if hosts_left == 0:
                kind = "kill_leader"  # no spare left to take the host's work
            else:
                hosts_left -= 1
        ids = s.replica_ids
        if kind == "kill_controller":
            faults.append(Fault(kind, down_s=round(rng.uniform(*s.controller_down_s), 2)))
        elif kind in ("swap_then_kill_controller", "kill_host_in_grace"):
            faults.append(Fault(kind, (rng.choice(ids),), down_s=round(rng.uniform(*s.controller_down_s), 2)))
        elif kind == "kill_controller_catching_up":
            faults.append(Fault(kind, (rng.choice(ids),), rank=rng.randrange(s.ranks),
                                down_s=round(rng.uniform(*s.controller_down_s), 2)))
        elif kind == "double_kill":
            faults.append(Fault(kind, tuple(sorted(rng.sample(ids, 2)))))
        elif kind == "stop_replica":
            stop = s.heartbeat_timeout_s + rng.uniform(*s.stop_past_timeout_s)
            faults.append(Fault(kind, (rng.choice(ids),), stop_s=round(stop, 2)))
        elif kind == "kill_rank":
            faults.append(Fault(kind, (rng.choice(ids),), rank=rng.randrange(1, s.ranks)))
        elif kind == "kill_source":
            faults.append(Fault(kind, (rng.choice(ids),), rank=rng.randrange(s.ranks)))
        else:
            faults.append(Fault(kind, (rng.choice(ids),)))
    return tuple(faults)


def stop_past_the_timeouts(stop_s: float, now: float, takeover_at: float | None, grace_s: float,
                           heartbeat_timeout_s: float) -> float:
    """How long a SIGSTOP that lands at `now` must last to outlast the silence the controller
    allows by as much as a `stop_s` stop outlasts the heartbeat timeout: right after a takeover
    (at `takeover_at`) silence is counted only once its grace (`grace_s`) is over."""
    if takeover_at is None:
        return stop_s
    silent_until = takeover_at + grace_s + heartbeat_timeout_s  # the earliest death by silence
    return round(max(stop_s, silent_until - now + stop_s - heartbeat_timeout_s), 2)


def parse_seeds(text: str) -> list[int]:
    """"1-50", "3", "1,4,9-12" -> the seeds in order; ValueError names a bad part."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ValueError(f"seed range {part!r} is not N or N-M (e.g. 1-50)") from None
        if first < 0 or last < first:
            raise ValueError(f"seed range {part!r} must be N-M with 0 <= N <= M")
        seeds += range(first, last + 1)
    if len(seeds) > 10_000:
        raise ValueError(f"{len(seeds)} seeds is too many for one run (at most 10000)")
    return seeds
