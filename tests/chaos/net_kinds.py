"""The chaos run's network faults: carried out on a ChaosRun built on a test network
(tests/chaos/network.py), each healed `stop_s` after it began, as ChaosRun._inject does for
the process faults (first action now, the follow-up `now -> (next or None, poll fast)`).

| kind                      | what is done for `stop_s`                                | touches         |
|---------------------------|----------------------------------------------------------|-----------------|
| partition_host            | the replica's host exchanges nothing with any node       | replica, host   |
| cut_host_from_peers       | the host reaches the controllers and etcd, not the other | nothing*        |
|                           | hosts (its replica's FTAR and catch-up fail)             |                 |
| cut_host_from_controllers | the host reaches its peers, not the controllers          | replica, host   |
| cut_leader_from_etcd      | the leading controller loses etcd, agents still reach it | the controller  |
|                           | (it must step down within its lease; the other leads)    |                 |
| lossy_host                | `percent` % of the host's packets lost each way          | nothing         |
| capped_host               | the host's link capped at `rate_kbit` kbit/s (tbf)       | nothing         |
| slow_host                 | what the host sends waits `delay_ms` +- a fifth of it    | nothing         |
| skewed_host               | a new host joins as a spare, its clock `skew_s` off:     | nothing         |
|                           | beyond 300 s refused naming the skew, within it a spare  |                 |
|                           | that stays (tests/chaos/skewed_host.py)                  |                 |

*the controller still hears both replicas, so nobody is declared dead: their all-reduce fails
and both retry until the cut heals (the job stalls for the cut, within the stall bound).

A fault whose kind "touches" a replica expects it declared dead and HEALTHY again (the
executor's `_settled`); the others expect nobody dead and only slower steps. A cut that takes
a replica out (OUT_KINDS) lasts past a takeover's grace when one runs, as stop_replica does
(`ChaosRun._past_the_timeouts`): until then silence costs nobody a death.

`make_net_schedule(seed, settings)` draws a seeded schedule of these kinds (bench.chaos
--network), one of each in a seeded order when there are as many faults as kinds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from protos.credentials import REGISTRATION_WINDOW_S
from tests.chaos import skewed_host
from tests.chaos.schedule import ChaosSettings, Fault

if TYPE_CHECKING:
    from tests.chaos.executor import ChaosRun, Injection

KINDS = ("partition_host", "cut_host_from_peers", "cut_host_from_controllers", "cut_leader_from_etcd",
         "lossy_host", "capped_host", "slow_host", "skewed_host")
#: kinds after which the replica cut off from its quorum may commit nothing until healed
CUT_OFF_KINDS = ("partition_host", "cut_host_from_controllers")
#: kinds that take a replica out (declared dead, then back)
OUT_KINDS = ("partition_host", "cut_host_from_controllers")


@dataclass(frozen=True)
class NetSettings(ChaosSettings):
    """A network chaos cluster: fewer processes than the process-fault run needs (no double
    kill, no rank kill), so 2 replicas of 1 rank and no spare by default."""
    replicas: int = 2
    ranks: int = 1
    spares: int = 0
    faults: int = len(KINDS)
    fault_s: tuple[float, float] = (5.0, 7.0)     # each fault lasts this long (past the heartbeat timeout)
    loss_percent: tuple[int, int] = (1, 5)
    rate_kbit: tuple[int, int] = (2000, 8000)
    delay_ms: tuple[int, int] = (50, 150)
    # skewed_host: half the draws beyond the registration window (REGISTRATION_WINDOW_S, 300 s),
    # half within it, each side of the controller's clock
    skew_beyond_s: tuple[float, float] = (REGISTRATION_WINDOW_S + 50, REGISTRATION_WINDOW_S + 200)
    skew_within_s: tuple[float, float] = (30.0, REGISTRATION_WINDOW_S - 60)

    def validate(self) -> "NetSettings":
        problems = []
        if self.replicas < 2:
            problems.append(f"replicas must be at least 2 (a cut needs a peer), got {self.replicas}.")
        if self.ranks < 1:
            problems.append(f"ranks must be at least 1, got {self.ranks}.")
        low, high = self.fault_s
        if not self.heartbeat_timeout_s < low <= high:
            problems.append(f"fault_s must be a range (low, high) above heartbeat_timeout_s "
                            f"({self.heartbeat_timeout_s:g}s) so a cut replica is declared dead, got {self.fault_s}.")
        if not 1 <= self.loss_percent[0] <= self.loss_percent[1] <= 99:
            problems.append(f"loss_percent must be a range within 1..99, got {self.loss_percent}.")
        if not 8 <= self.rate_kbit[0] <= self.rate_kbit[1]:
            problems.append(f"rate_kbit must be a range from at least 8, got {self.rate_kbit}.")
        if not 1 <= self.delay_ms[0] <= self.delay_ms[1] <= 10_000:
            problems.append(f"delay_ms must be a range within 1..10000, got {self.delay_ms}.")
        if not REGISTRATION_WINDOW_S < self.skew_beyond_s[0] <= self.skew_beyond_s[1]:
            problems.append(f"skew_beyond_s must be a range beyond the {REGISTRATION_WINDOW_S:g}s registration window, "
                            f"got {self.skew_beyond_s}.")
        if not 0 < self.skew_within_s[0] <= self.skew_within_s[1] < REGISTRATION_WINDOW_S:
            problems.append(f"skew_within_s must be a range within the {REGISTRATION_WINDOW_S:g}s registration window, "
                            f"got {self.skew_within_s}.")
        if problems:
            raise ValueError(" ".join(problems))
        ChaosSettings.validate(replace(self, replicas=max(self.replicas, 3), ranks=max(self.ranks, 2)))
        return self


def make_net_schedule(seed: int, s: NetSettings) -> tuple[Fault, ...]:
    """The network faults of run `seed`: a seeded permutation of KINDS taken in turn."""
    s.validate()
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    out = []
    for i in range(s.faults):
        kind = kinds[i % len(kinds)]
        lasts = round(rng.uniform(*s.fault_s), 1)
        target = () if kind in ("cut_leader_from_etcd", "skewed_host") else (rng.choice(s.replica_ids),)
        skew = 0.0
        if kind == "skewed_host":
            skew = round(rng.uniform(*(s.skew_beyond_s if rng.random() < 0.5 else s.skew_within_s)), 1)
            skew *= rng.choice((1, -1))
        out.append(Fault(kind, target, stop_s=lasts,
                         percent=rng.randint(*s.loss_percent) if kind == "lossy_host" else 0,
                         rate_kbit=rng.randint(*s.rate_kbit) if kind == "capped_host" else 0,
                         delay_ms=rng.randint(*s.delay_ms) if kind == "slow_host" else 0, skew_s=skew))
    return tuple(out)


def inject(run: "ChaosRun", f: Fault, inj: "Injection"):
    """Carry out network fault `f` on `run` now; returns the follow-up that heals it."""
    net = run.net
    if net is None:
        raise ValueError(f"fault {f.describe()} needs a test network: give ChaosRun net=Network()")
    if f.kind == skewed_host.KIND:
        return skewed_host.join(run, f, inj)
    faults = net.faults
    lasts = f.stop_s
    if f.kind == "cut_leader_from_etcd":
        leader, _ = run._leader()
        if leader is None:
            raise RuntimeError("no controller leads: cannot cut the leader from etcd")
        fid = faults.cut(f"c{leader.name}", ["etcd"])
        inj.controller_killed_at, inj.controller = inj.at, leader.name
        inj.detail.append(f"controller {leader.name} cut from etcd (agents still reach it) for {f.stop_s:g}s")
    else:
        rid = f.replicas[0]
        host = run._host_of(rid)
        others = [n for n in net.nodes if n != host]
        hosts = [n for n in others if n.startswith(("h", "spare"))]
        if f.kind == "partition_host":
            fid = faults.partition(host)
        elif f.kind == "cut_host_from_peers":
            fid = faults.cut(host, hosts)
        elif f.kind == "cut_host_from_controllers":
            fid = faults.cut(host, ["ca", "cb"])
        elif f.kind == "lossy_host":
            fid = faults.loss(host, f.percent)
        elif f.kind == "capped_host":
            fid = faults.bandwidth(host, f.rate_kbit)
        elif f.kind == "slow_host":
            fid = faults.delay(host, f.delay_ms, f.delay_ms / 5, seed=run.seed)
        else:
            raise ValueError(f"unknown network fault kind {f.kind!r} (kinds: {', '.join(KINDS)})")
        if f.kind in OUT_KINDS:
            run._touch(inj, rid)
            inj.hosts.append(host)
            # right after a takeover the new leader forgives silence for its grace: a cut that
            # must cost the replica a death lasts past it (as stop_replica's SIGSTOP does)
            lasts = run._past_the_timeouts(f.stop_s, inj.at)
        inj.detail.append(f"{faults.records[-1].detail} for {lasts:g}s" + (
            f" (not {f.stop_s:g}s: a takeover's grace forgives silence)" if lasts > f.stop_s else ""))

    def heal(now: float):
        if now < inj.at + lasts:
            return heal, False
        faults.heal(fid)
        inj.detail.append(f"healed after {now - inj.at:.1f}s")
        return None, False
    return heal


def figures(rec, s: ChaosSettings) -> list[dict]:
    """Per network fault, what it cost (pure, from the run's record): `exclude_s` from the cut
    to the controller declaring the replica dead, `back_s` from the heal to the replica HEALTHY
    again, `survivors_stall_s` the longest a replica it did not touch went without a commit
    while it lasted, `steps_missed` the steps the job committed without the cut replica."""
    commits: dict[str, list[tuple[float, int]]] = {}
    for r in rec.rows:
        if r.get("event") == "commit" and r.get("rank") == 0:
            commits.setdefault(r["replica"], []).append((r["t"], r["step"]))
    out = []
    for inj in rec.injections:
        if inj.kind not in KINDS:
            continue
        end = inj.settled_at if inj.settled_at is not None else rec.ended_at
        row = {"kind": inj.kind, "scheduled": inj.scheduled, "lasted_s": _round(inj.done_at, inj.at)}
        for rid in inj.replicas:
            died = [e["at"] for e in rec.events if e["kind"] == "death" and e["subject"] == rid and e["at"] >= inj.at - 1]
            back = [e["at"] for e in rec.events if e["kind"] == "replica" and e["subject"] == rid
                    and "became HEALTHY" in e["message"] and inj.done_at is not None and e["at"] >= inj.done_at]
            row["exclude_s"] = _round(min(died, default=None), inj.at)
            row["back_s"] = _round(min(back, default=None), inj.done_at)
            mine = {step for t, step in commits.get(rid, [])}
            others = {step for other, rows in commits.items() if other != rid for t, step in rows if inj.at <= t <= end}
            row["steps_missed"] = len(others - mine)
        stall = 0.0
        for rid in s.replica_ids:
            if rid in inj.replicas:
                continue
            times = [t for t, _ in sorted(commits.get(rid, [])) if inj.at < t < end]
            points = [inj.at, *times, end]
            stall = max(stall, *(b - a for a, b in zip(points, points[1:])))
        row["survivors_stall_s"] = round(stall, 2)
        out.append(row)
    return out


def _round(t: float | None, since: float | None) -> float | None:
    return None if t is None or since is None else round(t - since, 2)
