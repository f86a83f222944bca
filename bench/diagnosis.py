"""Diagnosis at scale: synthetic telemetry of a large job with injected faults, analyzed by the
controller's real analyzers (controller.core.diagnosis), scored against the truth.

    python -m bench.diagnosis --ranks 32768 --faults 1500 --json

The job: `--replicas` replicas (default 16) x ranks/replicas ranks, 8 ranks per host (32,768
ranks: 16 x 2,048 on 4,096 hosts). Every rank is in its replica's group ("replica", 2,048
members) and in its rank position's FTAR ring ("ftar.q1", one member per replica). What the
agents would send is synthesized per host (the ring -> summary path itself is tested with real
processes in tests/agent): every round one window of own times per group, and one committed
step with replica and rank digests.

Faults, in equal shares (one hang per round: two hangs in one job would meet in the same rings):
  hang-not-joined    a rank hangs outside collectives; its replica waits in the next
                     reduce-scatter, the other replicas in their FTAR ops (round of its own)
  hang-no-progress   a rank joins a collective (FTAR or intra-replica, half each) and never
                     sends a byte; ring neighbours send one or more chunks before starving
  straggler          a rank's own work is slower by 10..200 % for the rest of its batch
  sdc                a host corrupts one of its 8 ranks' shards in 80 % of the steps
Stragglers and SDC hosts run in batches (one fault per replica, 3 rounds each).

Noise: per-window jitter (2 %), one-off slow collectives and pauses (1 % of windows, +20..100 %
once), 5 % of hosts persistently 3 % slower (below the straggler threshold), clock skew between
hosts (each host's clock offset by up to +-30 s: ages are taken on the host's clock, so it
cancels, and the bench computes them that way), 0.3 % of hosts whose report arrived one
round late, a software divergence (a replica differing on 40 % of its ranks) in 2 % of the steps.

One JSON line (FIELDS): ranks, replicas, hosts, faults, accuracy_pct (and accuracy_by_kind_pct per fault kind) (the faulty host named first), in_candidates_pct, median_candidates,
false_findings (confident findings naming a healthy host), analysis_p99_s (one round: every
host's report ingested plus the analysis; wall time, so a loaded machine shows in it) and
analysis_cpu_p99_s (the same in this process's CPU time), telemetry_bytes_per_rank (the ring), and
summary_bytes_per_rank (what an agent sends per rank per interval, protobuf).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from controller.core.digests import compare
from controller.core.diagnosis.engine import Diagnosis
from controller.core.diagnosis.findings import Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import GroupReport, HostReport, RankReport, Window
from protos import controller_pb2 as pb
from protos import telemetry_ring as ring
from protos.telemetry_ring import Kind

PER_HOST = 8
#: the fields of the JSON line (`python -m bench.diagnosis --json`) and their types
FIELDS = {"ranks": int, "replicas": int, "hosts": int, "faults": int, "accuracy_pct": float,
          "in_candidates_pct": float, "median_candidates": float, "accuracy_by_kind_pct": dict,
          "false_findings": int, "analysis_p99_s": float, "analysis_cpu_p99_s": float,
          "telemetry_bytes_per_rank": int, "summary_bytes_per_rank": int}
INTRA, CROSS = "replica", "ftar.q1"
ROUND_S = 5.0
OWN_INTRA_S, OWN_CROSS_S = 3.0, 0.05
CHUNK = 8 << 20
NBYTES = 256 << 20


@dataclass(frozen=True)
class Fault:
    kind: str
    replica: str
    rank: int
    host: str
    detail: str = ""


class Job:
    def __init__(self, ranks: int, replicas: int, rng: random.Random) -> None:
        self.replicas = [f"r{i}" for i in range(replicas)]
        self.world = ranks // replicas
        self.rng = rng
        self.hosts = {(rid, k): f"h{i}-{k // PER_HOST}" for i, rid in enumerate(self.replicas)
                      for k in range(self.world)}
        self.host_list = sorted(set(self.hosts.values()))
        self.warm_hosts = {h for h in self.host_list if rng.random() < 0.05}  # 3 % slower, always
        self.skew = {h: rng.uniform(-30, 30) for h in self.host_list}
        self.round = 0
        self.intra_seq, self.cross_seq = 100, 200
        self.np = np.random.default_rng(rng.randrange(1 << 30))
        self.rank_list = sorted(self.hosts, key=lambda rk: (self.hosts[rk], rk))
        self.index = {rk: i for i, rk in enumerate(self.rank_list)}
        self.warm = np.array([1.03 if self.hosts[rk] in self.warm_hosts else 1.0 for rk in self.rank_list])
        self.by_host = [(h, [self.index[rk] for rk in rks]) for h, rks in sorted(self.host_ranks().items())]

    def host_ranks(self):
        by: dict[str, list[tuple[str, int]]] = {}
        for rk, h in self.hosts.items():
            by.setdefault(h, []).append(rk)
        return by

    def members_of(self, key, size):
        if key.replica_id:
            return [(key.replica_id, k) for k in range(size)] if size == self.world else None
        return [(rid, key.rank) for rid in self.replicas] if size == len(self.replicas) else None

    def host_of(self, rk):
        return self.hosts.get(rk)

    def replica_hosts(self, rid):
        return sorted({h for (r, _), h in self.hosts.items() if r == rid})


def window_reports(job: Job, slow: dict[tuple[str, int], float], now: float) -> list[HostReport]:
    """A steady round: every rank between collectives, one new window per group."""
    n, w, rnd = len(job.rank_list), job.round, job.np
    own = OWN_INTRA_S * job.warm * (1 + 0.02 * rnd.standard_normal(n))
    for i, factor in ((job.index[rk], f) for rk, f in slow.items()):
        own[i] *= factor
    once = rnd.random(n) < 0.01  # one slow collective or a pause, once
    own[once] += OWN_INTRA_S * rnd.uniform(0.2, 1.0, int(once.sum()))
    cross = (OWN_CROSS_S * (1 + 0.02 * rnd.standard_normal(n))).tolist()
    own = own.tolist()
    R, W, s, f = len(job.replicas), job.world, job.intra_seq, job.cross_seq
    rs, ftar = int(Kind.REDUCE_SCATTER), int(Kind.FTAR_ALL_REDUCE)
    out = []
    for host, idx in job.by_host:
        out.append(HostReport(host, 32, tuple(
            RankReport(job.rank_list[i][0], job.rank_list[i][1], 0.01, 3600.0, (
                GroupReport(INTRA, rs, W, s, s, -1, 0.0, 0, 0, 0.0, (Window(w, own[i], 1.0),)),
                GroupReport(CROSS, ftar, R, f, f, -1, 0.0, 0, 0, 0.0, (Window(w, cross[i], 0.5),))))
            for i in idx)))
    return out


def group(name, kind, size, joined, done, pending=None):
    g = GroupReport(name, int(kind), size, joined, done)
    if pending is not None:
        seq, age, sent, idle = pending
        g = GroupReport(name, int(kind), size, joined, done, seq, age, NBYTES, sent, idle)
    return g


def with_window(g: GroupReport, w: Window) -> GroupReport:
    return GroupReport(g.group, g.kind, g.size, g.last_joined_seq, g.last_done_seq, g.pending_seq, g.pending_s,
                       g.pending_nbytes, g.pending_sent_bytes, g.pending_idle_s, (w,))


def hang_reports(job: Job, fault: Fault, now: float) -> list[tuple[HostReport, float]]:
    """Everyone as the job looks `waited` seconds into the hang, with the time each report
    arrived. Ages are computed on each host's clock (skewed), so skew cancels exactly as it does
    for real agents; a late host's report arrived one round ago (the hang already held)."""
    rng = job.rng
    waited = rng.uniform(31, 120)
    culprit = (fault.replica, fault.rank)
    s, f = job.intra_seq + 1, job.cross_seq + 1
    order = {rid: i for i, rid in enumerate(job.replicas)}
    out = []
    for host, ranks in job.host_ranks().items():
        sent_at = now - (ROUND_S if rng.random() < 0.003 else 0.0)
        host_now = sent_at + job.skew[host]
        joined_at = now - waited + rng.uniform(0, 1.0) + job.skew[host]  # on this host's clock
        age = max(host_now - joined_at, 0.0)
        reports = []
        shared: dict[tuple, GroupReport] = {}  # a host's ranks mostly look alike: build each look once

        def make(*args):
            g = shared.get(args)
            if g is None:
                g = shared[args] = group(*args)
            return g
        for rk in ranks:
            groups, idle = _hang_groups(job, fault, rk, culprit, s, f, age, order, rng, make)
            reports.append(RankReport(rk[0], rk[1], idle, 3600.0, groups))
        out.append((HostReport(host, 32, tuple(reports)), sent_at))
    return out


def _hang_groups(job, fault, rk, culprit, s, f, age, order, rng, group):
    R, W = len(job.replicas), job.world
    rid, k = rk
    done_i = group(INTRA, Kind.REDUCE_SCATTER, W, s - 1, s - 1)
    done_x = group(CROSS, Kind.FTAR_ALL_REDUCE, R, f - 1, f - 1)
    if fault.kind == "hang-not-joined":
        if rk == culprit:
            return (done_i, done_x), age + rng.uniform(0.5, 5)
        if rid == fault.replica:  # waits in its replica's reduce-scatter for the culprit
            return (group(INTRA, Kind.REDUCE_SCATTER, W, s, s - 1, (s, age, CHUNK * rng.randint(0, 1), age)),
                    done_x), age
        # other replicas finished the reduce-scatter and wait in their FTAR op
        return (group(INTRA, Kind.REDUCE_SCATTER, W, s, s),
                group(CROSS, Kind.FTAR_ALL_REDUCE, R, f, f - 1, (f, age, CHUNK * rng.randint(0, 1), age))), age
    cross = fault.detail == "ftar"
    if cross:
        # the ring of rank position `k`; everybody else's FTAR op completed, and they wait in
        # the next reduce-scatter for their own rank `fault.rank`, stuck in that ring
        if k == fault.rank:
            d = (order[rid] - order[fault.replica]) % R  # ring distance downstream of the culprit
            sent = 0 if d == 0 else CHUNK * min(d, 2 * (R - 1))
            return (group(INTRA, Kind.REDUCE_SCATTER, W, s - 1, s - 1),
                    group(CROSS, Kind.FTAR_ALL_REDUCE, R, f, f - 1, (f, age, sent, age if d == 0 else age - 0.01 * d))), age
        return (group(INTRA, Kind.REDUCE_SCATTER, W, s, s - 1, (s, age - 0.5, CHUNK, age - 0.5)),
                group(CROSS, Kind.FTAR_ALL_REDUCE, R, f, f)), age
    # inside the culprit replica's reduce-scatter; the other replicas wait in FTAR for it
    if rid == fault.replica:
        d = (k - fault.rank) % W
        sent = 0 if d == 0 else CHUNK * min(d, 2 * (W - 1))
        return (group(INTRA, Kind.REDUCE_SCATTER, W, s, s - 1, (s, age, sent, age if d == 0 else age - 1e-4 * d)),
                done_x), age
    return (group(INTRA, Kind.REDUCE_SCATTER, W, s, s),
            group(CROSS, Kind.FTAR_ALL_REDUCE, R, f, f - 1, (f, age - 0.5, CHUNK, age - 0.5))), age


def digests(job: Job, step: int, sdc: list[Fault]):
    """Replica and rank digests of one committed step, with corruption and divergence noise."""
    rng = job.rng
    good = tuple(f"{step:08x}{k:08x}" for k in range(job.world))
    ranks = {rid: good for rid in job.replicas}
    for fault in sdc:
        if rng.random() < 0.8:
            k = int(fault.detail)
            ranks[fault.replica] = good[:k] + ("deadbeef%08x" % k,) + good[k + 1:]
    if rng.random() < 0.02:  # a software divergence: many ranks of one replica differ
        rid = rng.choice(job.replicas)
        ranks[rid] = tuple(d if rng.random() > 0.4 else "0badc0de%08x" % i for i, d in enumerate(ranks[rid]))
    replica = {rid: hashlib.sha256("".join(r).encode()).hexdigest()[:32] for rid, r in ranks.items()}
    return replica, ranks


def run(ranks: int, replicas: int, faults: int, seed: int) -> dict:
    rng = random.Random(seed)
    job = Job(ranks, replicas, rng)
    settings = DiagnosisSettings(hang_after_s=30.0, analysis_interval_s=ROUND_S, straggler_windows=3,
                                 straggler_of_windows=5)
    kinds = ["hang-not-joined", "hang-no-progress", "straggler", "sdc"]
    plan = [kinds[i % 4] for i in range(faults)]
    rng.shuffle(plan)
    hangs = [k for k in plan if k.startswith("hang")]
    others = [k for k in plan if not k.startswith("hang")]
    results: list[tuple[Fault, Finding | None]] = []
    timings: list[float] = []
    cpu: list[float] = []
    false_findings = 0
    now = 10_000.0

    def fresh() -> Diagnosis:
        return Diagnosis(settings, digest_steps=16)

    # stragglers and SDC hosts: batches of one fault per replica, three rounds each
    step = 0
    while others:
        batch, others = others[:replicas], others[replicas:]
        d = fresh()
        chosen = rng.sample(job.replicas, len(batch))
        fs = []
        for kind, rid in zip(batch, chosen):
            k = rng.randrange(job.world)
            fs.append(Fault(kind, rid, k, job.hosts[(rid, k)], str(k) if kind == "sdc" else f"{rng.uniform(0.1, 2.0):.3f}"))
        slow = {(f.replica, f.rank): 1 + float(f.detail) for f in fs if f.kind == "straggler"}
        sdc = [f for f in fs if f.kind == "sdc"]
        found: list[Finding] = []
        for _ in range(3):
            job.round += 1
            now += ROUND_S
            reports = window_reports(job, slow, now)
            t0, c0 = time.perf_counter(), time.process_time()
            for r in reports:
                found += d.ingest(r, now, lambda rk: True, len(job.hosts))[0]
            found += d.analyze(now, job.members_of, job.host_of, lambda rk: False)
            step += 1
            replica_digests, rank_digests = digests(job, step, sdc)
            for rid in job.replicas:
                d.keep_rank_digests(rid, step, rank_digests[rid])
            verdict = compare(step, replica_digests)
            if verdict is not None and verdict.mismatch:
                found += d.incidents(verdict, lambda rid, k: job.hosts.get((rid, k)), job.replica_hosts, now)
            timings.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        false_findings += _score(fs, found, results, settings)

    # hangs: a round each, on a job otherwise healthy
    for kind in hangs:
        rid, k = rng.choice(job.replicas), rng.randrange(job.world)
        fault = Fault(kind, rid, k, job.hosts[(rid, k)], rng.choice(("ftar", "intra")) if kind == "hang-no-progress" else "")
        d = fresh()
        now += ROUND_S
        reports = hang_reports(job, fault, now)
        t0, c0 = time.perf_counter(), time.process_time()
        for r, received_at in reports:
            d.ingest(r, received_at, lambda rk: True, len(job.hosts))
        found = d.analyze(now, job.members_of, job.host_of, lambda rk: False)
        timings.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        false_findings += _score([fault], found, results, settings)

    named_first = sum(1 for f, x in results if x is not None and x.hosts and x.hosts[0] == f.host)
    in_candidates = sum(1 for f, x in results if x is not None and f.host in x.hosts)
    candidates = [len(x.hosts) for _, x in results if x is not None]
    by_kind = {}
    for kind in kinds:
        mine = [(f, x) for f, x in results if f.kind == kind]
        by_kind[kind] = round(100.0 * sum(1 for f, x in mine if x is not None and x.hosts and x.hosts[0] == f.host)
                              / max(len(mine), 1), 2)
    timings.sort()
    cpu.sort()
    return {
        "bench": "diagnosis", "ranks": replicas * job.world, "replicas": replicas, "ranks_per_replica": job.world,
        "hosts": len(job.host_list), "faults": len(results),
        "accuracy_pct": round(100.0 * named_first / max(len(results), 1), 2),
        "in_candidates_pct": round(100.0 * in_candidates / max(len(results), 1), 2),
        "median_candidates": statistics.median(candidates) if candidates else 0,
        "accuracy_by_kind_pct": by_kind,
        "false_findings": false_findings,
        "analysis_p50_s": round(timings[len(timings) // 2], 4),
        "analysis_p99_s": round(timings[min(int(len(timings) * 0.99), len(timings) - 1)], 4),
        "analysis_cpu_p99_s": round(cpu[min(int(len(cpu) * 0.99), len(cpu) - 1)], 4),
        "rounds": len(timings),
        "telemetry_bytes_per_rank": ring.ring_bytes(ring.DEFAULT_CAPACITY),
        "summary_bytes_per_rank": summary_bytes(job),
        "seed": seed,
    }


def _score(faults: list[Fault], found: list[Finding], results: list, settings: DiagnosisSettings) -> int:
    """Match each fault with the first finding of its kind about its replica; count confident
    findings that match no fault."""
    used = set()
    for fault in faults:
        want = FindingKind.HANG if fault.kind.startswith("hang") else FindingKind(fault.kind)
        match = next((i for i, x in enumerate(found) if i not in used and x.kind == want
                      and any(r.split("/")[0] == fault.replica for r in x.ranks)
                      or (i not in used and x.kind == want and not x.ranks and fault.host in x.hosts)), None)
        if match is not None:
            used.add(match)
        results.append((fault, found[match] if match is not None else None))
    return sum(1 for i, x in enumerate(found) if i not in used and x.confidence >= settings.min_confidence
               and not any(x.hosts and x.hosts[0] == f.host for f in faults))


def summary_bytes(job: Job) -> int:
    """What an agent sends per rank per interval: a host's report with one window per group."""
    g = lambda name, kind, size: pb.GroupTelemetry(  # noqa: E731
        group=name, kind=int(kind), size=size, last_joined_seq=123456, last_done_seq=123455, pending_seq=123456,
        pending_s=0.8, pending_nbytes=NBYTES, pending_sent_bytes=CHUNK * 3, pending_idle_s=0.01,
        windows=[pb.TelemetryWindow(index=3858, own_s=3.0123, wait_s=0.9876)])
    report = pb.TelemetryReport(host_id="h15-255", agent_secret="0" * 43, window_collectives=32, ranks=[
        pb.RankTelemetry(replica_id="r15", rank=2040 + i, idle_s=0.01, recording_s=3600.0,
                         groups=[g(INTRA, Kind.REDUCE_SCATTER, job.world),
                                 g(CROSS, Kind.FTAR_ALL_REDUCE, len(job.replicas))]) for i in range(PER_HOST)])
    return len(report.SerializeToString()) // PER_HOST


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diagnosis", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=32768)
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--faults", type=int, default=1500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON line (the default prints it indented)")
    args = p.parse_args(argv)
    if args.ranks < args.replicas * PER_HOST or args.ranks % (args.replicas * PER_HOST):
        print(f"--ranks must be a multiple of replicas x {PER_HOST} = {args.replicas * PER_HOST}, got {args.ranks}",
              file=sys.stderr)
        return 2
    result = run(args.ranks, args.replicas, args.faults, args.seed)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
