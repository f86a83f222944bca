"""When does a job that can no longer progress become FAILED? A pure rule with a reason.

No replica can make progress when every registered replica is DEAD and each of them waits on
a host that cannot run (DEAD, or cordoned after a failure: a crash loop that spent its restart
budget ends there) while no spare is free to replace it. A DEAD replica whose hosts can all
run is not stuck: the controller restarts it. A DEAD replica with no host at all (a replica
started without agents, e.g. by torchrun) may come back by itself, so it is not stuck either.

`stuck_reason` says whether the job is stuck now; `failure_decision` says whether it has
been stuck long enough (`fail_after_s`) to FAIL. Time is passed in.

A crash loop fails at once (`crash_loop_cause`): when the job never committed a step and every
stuck replica waits on a host whose restart budget its trainers spent, all of them dying of the
same cause (exit code or signal, and the last line of stderr), no restart or spare would fare
better (a configuration error, a missing file): the job FAILS as soon as it is stuck, naming
the cause, instead of after `fail_after_s`. A job that committed a step keeps `fail_after_s`
(its state is worth waiting for), as does one whose replicas died of different causes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaOutlook:
    """What the rule needs to know of one replica."""

    replica_id: str
    dead: bool
    #: the first of its hosts that cannot run ("" when every host can, or it has none)
    down_host: str = ""
    #: why its trainers last died, when `down_host` waits after its restart budget was spent
    #: ("exit code 1: RuntimeError: ..."; "" when it waits for another reason or none is known)
    crash: str = ""


def stuck_reason(replicas: list[ReplicaOutlook], free_spares: int, configured: int) -> str:
    """Why no replica can make progress now, or "" while one can. `configured`: the job's
    replica count; while fewer replicas are known, more may still come (a job starting up)."""
    if len(replicas) < max(configured, 1):
        return ""  # not every configured replica has shown up yet: the job is still starting
    for r in replicas:
        if not r.dead or not r.down_host:
            return ""  # a live replica trains; a dead one whose hosts can run restarts
    if free_spares:
        return ""  # a spare will take a down host's work
    waits = ", ".join(f"{r.replica_id} on host {r.down_host}" for r in sorted(replicas, key=lambda r: r.replica_id))
    return (f"no replica can make progress: all {len(replicas)} are DEAD and wait on hosts that cannot run "
            f"({waits}), and no spare is free")


def crash_loop_cause(replicas: list[ReplicaOutlook], committed_any: bool) -> str:
    """The one cause every stuck replica's trainers died of, when the job never committed a
    step ("" otherwise: the job waits `fail_after_s`)."""
    if committed_any or not replicas:
        return ""  # a job that trained keeps its state worth waiting for
    causes = {r.crash for r in replicas}
    if len(causes) != 1 or "" in causes:
        return ""  # different causes (or one unknown): a spare or a returning host may fare better
    return causes.pop()


@dataclass(frozen=True)
class FailureDecision:
    #: since when the job has been stuck (None: it is not)
    stuck_since: float | None
    #: True: the job FAILS now, for `reason`
    fail: bool
    reason: str


def failure_decision(reason: str, stuck_since: float | None, now: float, fail_after_s: float,
                     crash_loop: str = "") -> FailureDecision:
    """Given the stuck reason now, since when the job has been stuck before, and the crash
    loop's cause (`crash_loop_cause`; "": none, wait `fail_after_s`)."""
    if not reason:
        return FailureDecision(None, False, "")
    since = now if stuck_since is None else stuck_since
    if crash_loop:
        return FailureDecision(since, True, f"crash loop before any committed step: every replica's trainers died "
                                            f"of the same cause ({crash_loop}) until their restart budgets were "
                                            f"spent; {reason}")
    if now - since >= fail_after_s:
        return FailureDecision(since, True, f"{reason} for {now - since:.1f}s (fail_after_s {fail_after_s:g})")
    return FailureDecision(since, False, f"{reason}; the job FAILS in {fail_after_s - (now - since):.1f}s unless a "
                                         f"replica can train again (a spare registers, a host returns)")
