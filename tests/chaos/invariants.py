"""The chaos test's invariants, checked over what a run recorded (pure: no I/O, no clock).

    verdict = check(recorded, settings)     # verdict.violations: sentences; verdict.stats: numbers

Data (the trainers' rows, tests/runtime/history_checks.py):
- identical state after every commit: every process that committed step n in quorum q
  holds the same digest;
- exactly once along the committed history: walked back from the newest committed state
  (rolled-back and abandoned branches excluded), each batch is in it once and none is
  skipped; and no branch was left silently: every abandoned branch has a rollback or a
  roll-forward event of the controller.
Faults (the controller's events against the executor's injections):
- no death is reported for a replica or host that no fault touched then (a fault's window
  runs from its injection until the job was whole again, plus `SLACK_S`); after the controller
  kill of a swap_then_kill_controller none is reported for what it touched either (the
  takeover keeps the spare's new work: issue 28);
- every fault was detected: a death of each replica it touched, a host death of each host
  it killed, a new leader after a controller kill (a composed one's too);
- every faulted replica rejoined (HEALTHY after its death), the job became whole after
  every fault, and every trainer finished;
- bounded stalls: a replica a fault did not touch went at most `settings.stall_bound_s`
  between two commits while the fault lasted.
Leadership (each controller's own log, tests/chaos/leadership.py):
- no two controllers acted as leader at once: one stepped down (or was killed) before the
  next became the leader, a controller cut from etcd included.
Network faults (tests/chaos/net_kinds.py):
- no commit by a replica cut off from its quorum: a partitioned replica commits nothing from
  `allreduce_timeout_s` after the cut (a step past its all-reduce may still end) until healed;
- a host whose clock is off beyond the registration window is refused naming the skew (counted
  as expected: `skew_refused`), one within it registers and stays a heard spare
  (`skew_within_stayed`; tests/chaos/skewed_host.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.chaos import leadership, skewed_host
from tests.chaos.executor import Injection, Recorded
from tests.chaos.net_kinds import CUT_OFF_KINDS, KINDS as NET_KINDS
from tests.chaos.schedule import ChaosSettings
from tests.runtime import history_checks as hc
from tests.runtime.cluster import Records

SLACK_S = 2.0     # events are stamped by another process's clock, after the signal landed
BEFORE_S = 0.5    # ...and may carry a time a little before the executor's own stamp


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def _window(inj: Injection, rec: Recorded) -> tuple[float, float]:
    end = inj.settled_at if inj.settled_at is not None else rec.ended_at
    return inj.at - BEFORE_S, end + SLACK_S


def _death_window(inj: Injection, rec: Recorded) -> tuple[float, float]:
    """When a death of what `inj` touched is its doing: its window, up to its quiet point."""
    lo, hi = _window(inj, rec)
    return lo, hi if inj.quiet_after is None else min(hi, inj.quiet_after + BEFORE_S)


def _when(rec: Recorded, t: float) -> str:
    return f"+{t - rec.started_at:.1f}s"


def check(rec: Recorded, s: ChaosSettings) -> Verdict:
    v = Verdict()
    v.stats = {"seed": rec.seed, "faults": dict(Counter(i.kind for i in rec.injections)), "skipped": rec.skipped,
               "wall_s": round(rec.ended_at - rec.started_at, 1)}
    if rec.error:
        v.violations.append(f"the run broke: {rec.error}")
    if not rec.finished:
        v.violations.append("not every trainer of every replica finished")
    if rec.leftover:
        v.violations.append(f"processes still running after the run stopped everything: {', '.join(rec.leftover)}")
    _check_data(rec, v)
    _check_deaths(rec, v)
    _check_detected_and_rejoined(rec, s, v)
    _check_stalls(rec, s, v)
    _check_one_leader(rec, v)
    _check_no_commit_cut_off(rec, s, v)
    _check_skewed_hosts(rec, v)
    v.stats["unexplained_moves"] = unexplained_moves(rec)
    return v


def unexplained_moves(rec: Recorded) -> list[str]:
    """Cordons and swaps of a host that no fault was aimed at while it lasted, one sentence each
    (not a violation: a host whose trainers die past the restart budget is replaced by design,
    and the schedule's own kills of a replica on a spare can spend that budget). The issue 42
    case: a replica moved back off a spare that no fault hit, in a run that passed and whose
    logs were gone; bench.chaos keeps the logs of a seed with one."""
    out = []
    for e in rec.events:
        if e["kind"] not in ("cordon", "swap"):
            continue
        if not any(e["subject"] in i.hosts and _window(i, rec)[0] <= e["at"] <= _window(i, rec)[1]
                   for i in rec.injections):
            out.append(f"{_when(rec, e['at'])} {e['kind']} of host {e['subject']}, which no fault was aimed at: "
                       f"{e['message']}")
    return out


def _check_skewed_hosts(rec: Recorded, v: Verdict) -> None:
    """A host whose clock is off beyond the registration window is refused naming the skew (the
    expected outcome, counted); one within it registers and stays (tests/chaos/skewed_host.py)."""
    skewed = [i for i in rec.injections if i.kind == skewed_host.KIND]
    if not skewed:
        return
    for inj in skewed:
        v.violations.extend(skewed_host.violations(inj))
    v.stats["skew_refused"] = sum(i.observed.get("exit_code") == skewed_host.REFUSED_EXIT for i in skewed)
    v.stats["skew_within_stayed"] = sum(not skewed_host.beyond(i.observed.get("skew_s", 0.0))
                                        and not skewed_host.violations(i) for i in skewed)


def _check_one_leader(rec: Recorded, v: Verdict) -> None:
    killed: dict[str, list[float]] = {}
    for inj in rec.injections:
        if inj.controller and inj.controller_killed_at is not None and inj.kind not in NET_KINDS:
            killed.setdefault(inj.controller, []).append(inj.controller_killed_at)
    spans = leadership.leader_spans(rec.leadership, killed, rec.ended_at)
    v.stats["leader_terms"] = len(spans)
    v.violations.extend(leadership.overlaps(spans))


def _check_no_commit_cut_off(rec: Recorded, s: ChaosSettings, v: Verdict) -> None:
    for inj in rec.injections:
        if inj.kind not in CUT_OFF_KINDS or inj.done_at is None:
            continue
        for rid in inj.replicas:
            late = [r for r in rec.rows if r.get("event") == "commit" and r.get("replica") == rid
                    and inj.at + s.allreduce_timeout_s < r["t"] < inj.done_at]
            if late:
                v.violations.append(f"{inj.scheduled} at {_when(rec, inj.at)}: {rid} committed step "
                                    f"{late[0].get('step')} at {_when(rec, late[0]['t'])} while cut off from its "
                                    f"quorum (healed at {_when(rec, inj.done_at)})")


def _check_data(rec: Recorded, v: Verdict) -> None:
    records = Records(rec.rows)
    try:
        v.stats["commits_checked"] = hc.check_identical_within_each_commit(records)
    except AssertionError as exc:
        v.violations.append(f"states differ after a commit: {exc}")
    try:
        history = hc.committed_history(records)
        replicas = sorted({r["replica"] for r in rec.rows if "replica" in r})
        hc.check_exactly_once_along(history, records, replicas)
    except AssertionError as exc:
        v.violations.append(f"exactly-once along the committed history: {exc}")
        return
    changes = [e for e in rec.events if e["kind"] in ("rollback", "roll_forward")]
    v.stats.update(steps=len(history.chain), abandoned_commits=len(history.abandoned),
                   abandoned_branches=history.branches, rollbacks=sum(e["kind"] == "rollback" for e in changes),
                   roll_forwards=sum(e["kind"] == "roll_forward" for e in changes))
    if history.branches > len(changes):
        steps = sorted({c.step for c in history.abandoned})
        v.violations.append(f"{history.branches} branch(es) of committed steps {steps} were abandoned, but the "
                            f"controller recorded only {len(changes)} rollback/roll-forward event(s): a silent "
                            f"change of history")


def _check_deaths(rec: Recorded, v: Verdict) -> None:
    """Every death the controller recorded falls in the window of a fault that touched it."""
    for e in rec.events:
        if e["kind"] == "death":
            windows = [_death_window(i, rec) for i in rec.injections if e["subject"] in i.replicas]
            what = f"replica {e['subject']}"
        elif e["kind"] == "host_death":
            windows = [_death_window(i, rec) for i in rec.injections if e["subject"] in i.hosts]
            what = f"host {e['subject']}"
        else:
            continue
        if not any(lo <= e["at"] <= hi for lo, hi in windows):
            v.violations.append(f"{what} was declared dead at {_when(rec, e['at'])} ({e.get('cause') or 'no cause'}: "
                                f"{e['message']}) but no fault touched it then" + (
                                    " (a controller kill after a swap must not cost a death)" if any(
                                        i.quiet_after is not None and i.quiet_after <= e["at"] for i in rec.injections)
                                    else ""))


def _check_detected_and_rejoined(rec: Recorded, s: ChaosSettings, v: Verdict) -> None:
    detection, rejoin = [], []
    for inj in rec.injections:
        lo, hi = _window(inj, rec)
        inside = [e for e in rec.events if lo <= e["at"] <= hi]
        name = f"{inj.scheduled} at {_when(rec, inj.at)}"
        if inj.settled_at is None:
            v.violations.append(f"{name}: the job was not whole again (every replica HEALTHY) within "
                                f"{s.fault_timeout_s:g}s of its last action; {'; '.join(inj.detail)}")
        if inj.kind == "kill_controller" or inj.controller_killed_at is not None:
            if not any(e["kind"] == "leader" and e["at"] >= (inj.controller_killed_at or inj.at) - BEFORE_S
                       for e in inside):
                v.violations.append(f"{name}: no controller took over after the active one was killed")
            if inj.kind == "kill_controller":
                continue
        for host in inj.hosts:
            if not any(e["kind"] == "host_death" and e["subject"] == host for e in inside):
                v.violations.append(f"{name}: host {host} was killed, but no host death was recorded")
        for rid in inj.replicas:
            deaths = [e for e in inside if e["kind"] == "death" and e["subject"] == rid]
            if not deaths:
                v.violations.append(f"{name}: {rid} was hit, but the controller never declared it dead")
                continue
            detection.append(deaths[0]["at"] - inj.hit_at.get(rid, inj.at))
            healthy = [e for e in inside if e["kind"] == "replica" and e["subject"] == rid
                       and "became HEALTHY" in e["message"] and e["at"] >= deaths[0]["at"]]
            if not healthy:
                v.violations.append(f"{name}: {rid} died at {_when(rec, deaths[0]['at'])} and never became HEALTHY "
                                    f"again")
            else:
                rejoin.append(healthy[0]["at"] - inj.hit_at.get(rid, inj.at))
    if detection:
        v.stats["detection_s_max"] = round(max(detection), 2)
    if rejoin:
        v.stats["rejoin_s_max"] = round(max(rejoin), 2)


def _check_stalls(rec: Recorded, s: ChaosSettings, v: Verdict) -> None:
    """While a fault lasts, the replicas it did not touch keep committing."""
    commits: dict[str, list[float]] = {}
    for r in rec.rows:
        if r.get("event") == "commit" and r.get("rank") == 0:
            commits.setdefault(r["replica"], []).append(r["t"])
    longest = 0.0
    for inj in rec.injections:
        end = inj.settled_at if inj.settled_at is not None else rec.ended_at
        for rid in s.replica_ids:
            if rid in inj.replicas:
                continue
            times = sorted(commits.get(rid, []))
            during = [t for t in times if inj.at < t < end]
            after = next((t for t in times if t >= end), end)
            points = [inj.at, *during, after]
            gap = max(b - a for a, b in zip(points, points[1:]))
            longest = max(longest, gap)
            if gap > s.stall_bound_s:
                v.violations.append(f"{inj.scheduled} at {_when(rec, inj.at)}: {rid}, which it did not touch, went "
                                    f"{gap:.1f}s without a commit (bound {s.stall_bound_s:g}s)")
    v.stats["untouched_stall_s_max"] = round(longest, 2)
