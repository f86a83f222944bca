"""The demo's diagnosis settings (fthsdp/demo/run.py DIAGNOSIS), which bench.recovery's hang-rank
case runs with: valid, below the trainers' own timeouts, and quick. On a fake clock, through the
engine's own entry points (reports every telemetry interval, an analysis when due on each of the
controller's ticks), a rank that never joined its replica's collective is found once its peer has
waited hang_after_s, within one analysis interval of it, and not before."""

from __future__ import annotations

from collections import defaultdict

from controller.core.diagnosis.engine import Diagnosis
from controller.core.diagnosis.findings import FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.core.diagnosis.telemetry import HostReport, RankReport
from fthsdp.demo.run import DIAGNOSIS, SLOW_FACTOR, RunSettings
from protos.telemetry_ring import Kind
from tests.controller.diagnosis.synth import CROSS, INTRA, group

S = DiagnosisSettings(**DIAGNOSIS).validate()
JOINED_AT = 1000.0  # r1/0 joins collective #11 of its replica; r1/1 never does (it hangs)
REPORT_S, TICK_S = 0.5, 0.25  # the demo's agents' telemetry interval; the controller's tick
BENCH_STEP_S = 0.5  # bench.recovery's padded step


def _reports(now: float) -> list[HostReport]:
    """Every host's report at `now`: r0 and r2 between collectives, r1's ranks as the hang leaves them."""
    age = now - JOINED_AT
    ranks: dict[str, list[RankReport]] = defaultdict(list)
    for rid in ("r0", "r1", "r2"):
        for rank in (0, 1):
            intra = group(INTRA, Kind.ALL_REDUCE, 2, 10, 10)
            idle = 0.05
            if rid == "r1" and rank == 0 and age >= 0:
                intra, idle = group(INTRA, Kind.ALL_REDUCE, 2, 11, 10, (11, age, 4096, age)), age
            elif rid == "r1":
                idle = max(age, 0.0) + 0.3
            cross = group(CROSS, Kind.FTAR_ALL_REDUCE, 3, 20, 20)
            ranks[f"h-{rid}"].append(RankReport(rid, rank, idle, 600.0, (intra, cross)))
    return [HostReport(host, 8, tuple(rs)) for host, rs in ranks.items()]


def _members(key, size):
    if key.replica_id:
        return [(key.replica_id, k) for k in range(size)]
    return [(rid, key.rank) for rid in ("r0", "r1", "r2")]


def test_the_demo_settings_are_valid_and_below_the_trainers_own_timeouts(tmp_path):
    timeouts = RunSettings(3, 2, 30, 0, "sqrt").trainer_config(tmp_path, tmp_path, {})["timeouts"]
    # past the FTAR timeout the peers give up on a stuck collective: the analysis must see it first
    assert S.hang_after_s + S.analysis_interval_s < timeouts["allreduce_s"] < timeouts["vote_s"]
    # a slow host (SLOW_FACTOR x a step) keeps its peers waiting at most (SLOW_FACTOR - 1) steps:
    # at bench.recovery's steps that is a straggler, never a hang
    assert (SLOW_FACTOR - 1) * BENCH_STEP_S < S.hang_after_s
    assert S.analysis_interval_s <= TICK_S  # every tick may analyse


def test_a_rank_that_never_joined_is_found_within_an_analysis_interval_of_hang_after_s():
    d = Diagnosis(S, digest_steps=8)
    found_at, now, findings = None, JOINED_AT - 1.0, []
    next_report = now
    while found_at is None and now < JOINED_AT + 10:
        if now >= next_report:
            for report in _reports(now):
                d.ingest(report, now, lambda rk: True, pool_size=6)
            next_report += REPORT_S
        if d.due(now):
            findings = d.analyze(now, _members, lambda rk: f"h-{rk[0]}", lambda rk: False)
            if findings:
                found_at = now
        now = round(now + TICK_S, 6)
    assert found_at is not None, "the hang was never found"
    assert S.hang_after_s <= found_at - JOINED_AT <= S.hang_after_s + S.analysis_interval_s
    [f] = findings
    assert f.kind == FindingKind.HANG and f.hosts == ("h-r1",) and f.ranks == ("r1/1",)
    assert f.confidence >= S.min_confidence  # acted on: the host is evicted onto the spare
