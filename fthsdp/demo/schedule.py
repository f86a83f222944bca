"""The failure schedule of `fthsdp demo --failures`, parsed and validated (pure).

    kill-trainer@40:r1,kill-agent@90:r2

Each entry is KIND@STEP:REPLICA. kill-trainer SIGKILLs the replica's leader trainer (the
controller restarts the replica on its host; it rejoins behind and catches up); kill-agent SIGKILLs the agent that
hosts the replica and every trainer under it (a whole host dies; the controller notices the
heartbeat silence and a spare takes the assignment); hang-trainer SIGSTOPs the replica's last
rank (alive but silent: no exit for its agent to see, so only timeouts find it). The diagnosis
kinds make the host that runs the replica go bad, and the controller's diagnosis must find and
evict it (a spare takes its work; fthsdp/demo/faults.py): hang (its last rank stops before the
step's collectives), stall (it joins the FTAR all-reduce and never progresses), slow (3x slower)
and sdc (it flips a bit of its weights after every step). Errors name the bad entry.
The demo injects a failure only once every replica is HEALTHY again, so failures never
overlap: a later entry may land a few steps after its STEP.

Semi-synchronous runs (--sync local_sgd or diloco, a sync every H training steps;
streaming_diloco with F fragments, a sync of one fragment every K = H / F): STEP counts
training steps, and `placement` (with `every` K, `steps_per_sync`) says where a failure lands:
at step n with n % K = k != 0, in inner step k of the round before sync n // K (the replica
loses the inner steps since its last sync); at n = K * s, in sync s - 1 itself (its all-reduce
started: the sync retries without the replica). The default schedule hits both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

KILLS = ("kill-trainer", "kill-agent", "hang-trainer")
#: faults the diagnosis finds (each consumes a spare, like a host death)
DIAGNOSED = ("hang", "stall", "slow", "sdc")
KINDS = KILLS + DIAGNOSED
_ENTRY = re.compile(r"^(?P<kind>[a-z-]+)@(?P<step>\d+):(?P<replica>[A-Za-z0-9_.-]+)$")


class ScheduleError(ValueError):
    """The --failures text is not a valid schedule; the message names the bad entry."""


@dataclass(frozen=True)
class Failure:
    kind: str       # one of KINDS
    at_step: int    # injected once the job's step reaches this
    replica: str    # replica id, e.g. "r1"

    def describe(self) -> str:
        return f"{self.kind}@{self.at_step}:{self.replica}"


def replica_ids(replicas: int) -> list[str]:
    return [f"r{i}" for i in range(replicas)]


def default_text(*, replicas: int, steps: int, spares: int, every: int = 1) -> str:
    """The schedule used when --failures is not given: a trainer kill at 25% of the steps,
    then (with a spare) a host kill at 65%, on different replicas. Semi-synchronous (`every`
    H > 1, `placement`), with a spare: the host dies first, during the sync nearest 25% (a warm
    spare takes over in seconds), then the trainer, in inner step H/2 of the round at 65%
    (its cold restart takes longest); without a spare, the trainer dies in the round at 25%."""
    first, second = max(1, steps // 4), max(2, steps * 65 // 100)
    trainer, host = f"r{min(1, replicas - 1)}", f"r{min(2, replicas - 1)}"
    if every > 1:
        mid_inner = (second if spares > 0 else first) // every * every + every // 2
        at_sync = max(every, first // every * every)
        if spares > 0 and at_sync < mid_inner:
            return f"kill-agent@{at_sync}:{host},kill-trainer@{mid_inner}:{trainer}"
        return f"kill-trainer@{mid_inner}:{trainer}"
    text = f"kill-trainer@{first}:{trainer}"
    if spares > 0:
        text += f",kill-agent@{second}:{host}"
    return text


def steps_per_sync(sync_every: int, fragments: int = 1) -> int:
    """K, the training steps of one sync (one protocol step): H, or with streaming_diloco's F
    fragments H / F (one fragment synced every K training steps, each fragment every H)."""
    return sync_every // fragments


def placement(step: int, every: int) -> tuple[int, int]:
    """Where a failure at training `step` lands with a sync every `every` steps: (sync, inner).
    inner > 0: in that inner step of the round that ends with that sync; inner == 0: in the
    sync itself (every step is a sync when every == 1)."""
    if every == 1:
        return step, 0
    sync, inner = divmod(step, every)
    return (sync - 1, 0) if inner == 0 else (sync, inner)


def moment(step: int, every: int) -> str:
    """`placement` in words."""
    sync, inner = placement(step, every)
    if inner:
        return f"(inner step {inner} of {every} before sync {sync})"
    return f"(during sync {sync})"


def parse(text: str, *, replicas: int, steps: int, spares: int) -> list[Failure]:
    """The schedule, sorted by step. Empty text means no failures.

    Rules: known kind; step in [1, steps * 0.8] so the replica has time to rejoin before
    the end; a replica that exists; at most `spares` kill-agent entries (each host death
    consumes one spare); no two failures at the same step.
    """
    failures: list[Failure] = []
    known = replica_ids(replicas)
    last_step = max(1, int(steps * 0.8))
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        m = _ENTRY.match(entry)
        if m is None:
            raise ScheduleError(f"failure {entry!r} is not KIND@STEP:REPLICA "
                                f"(e.g. kill-trainer@40:r1).")
        kind, step, replica = m["kind"], int(m["step"]), m["replica"]
        if kind not in KINDS:
            raise ScheduleError(f"failure {entry!r} has unknown kind {kind!r}; "
                                f"expected one of {', '.join(KINDS)}.")
        if not 1 <= step <= last_step:
            raise ScheduleError(f"failure {entry!r} is at step {step}, outside 1..{last_step} "
                                f"(80% of --steps {steps}, leaving time to rejoin).")
        if replica not in known:
            raise ScheduleError(f"failure {entry!r} names replica {replica!r}; "
                                f"this run has {', '.join(known)}.")
        failures.append(Failure(kind, step, replica))
    failures.sort(key=lambda f: f.at_step)
    for a, b in pairwise(failures):
        if a.at_step == b.at_step:
            raise ScheduleError(f"failures {a.describe()!r} and {b.describe()!r} are at the same "
                                f"step; give each its own step.")
    takers = [f for f in failures if f.kind == "kill-agent" or f.kind in DIAGNOSED]
    if len(takers) > spares:
        raise ScheduleError(f"failure {takers[spares].describe()!r} is host loss number {spares + 1} (kill-agent "
                            f"and diagnosed faults each need a spare), but only {spares} spare host(s) exist "
                            f"(--spares).")
    bad_hosts = [f.replica for f in failures if f.kind in DIAGNOSED]
    if len(set(bad_hosts)) < len(bad_hosts):
        raise ScheduleError(f"replica {next(r for r in bad_hosts if bad_hosts.count(r) > 1)!r} has two diagnosed "
                            f"faults; one host goes bad in one way.")
    return failures
