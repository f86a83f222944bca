"""Goodput model: effective training time under failures, synchronous restart vs FT-HSDP.

Run ``python -m bench.goodput --json`` for one JSON line per scenario (FIELDS): scenario,
effective_training_pct (simulated), closed_form_pct, failures, horizon_h, seed, parameters.

The model is a discrete-event simulation over a long horizon. Failures arrive as a Poisson
process (mean time between failures ``mtbf_s`` for the whole job); each failure has a cause drawn
from the paper's Table 1 mix and hits one replica chosen uniformly. A cause either kills a host
(the replica needs a warm spare swapped in) or only a process (the trainer restarts in place).
Everything is a pure function of its inputs: the RNG is passed in, no clock is read.

Accounting
----------
*Synchronous restart.* Every failure stops the whole job for ``restart_s``. A failure that
arrives while the job is already down queues behind the current restart (the cluster keeps
failing at the same rate), so the long-run down fraction is exactly ``restart_s / mtbf_s`` (an
M/D/1 utilisation) and ``effective = 1 - restart_s / mtbf_s``. Paper: ``1 - 10/18 = 44%``.

*FT-HSDP.* Effective training time is the fraction of *replica-time* spent training: with ``R``
replicas over horizon ``H`` it is ``sum over replicas of (time that replica trains) / (R * H)``.
A failure costs, in this order:

1. a **whole-job stall** of ``detection_s + rebuild_s``: healthy replicas block in the
   all-reduce until the failure is detected, then rebuild FTAR and retry the failed step.
   Stalls queue like synchronous restarts;
2. the failed replica stays **out** while its host is swapped (``swap_s``, after waiting for a
   free spare if the warm pool is empty) or its process restarted (``restart_s``), then catches
   up (``catchup_s``) and pays the first-step overhead (``first_step_s``). Meanwhile the other
   ``R - 1`` replicas train;
3. optionally a **rejoin stall** (``rejoin_stall_s``): everyone waits at the step boundary for
   the returning replica.

Closed form without overlaps: ``1 - (stall + rejoin + out_after_stall / R) / mtbf``.

The paper (§7.1) gets 80% as ``(8 + 7 * 11/12) / 18``: per 18-minute failure interval, 3 minutes
of whole-job stall (60 s timeout + FTAR rebuild + ~20 s retried step + 45 s power smoother + 45 s
of a bug), then 7 more minutes with 11 of 12 replicas training (full repair takes 10 minutes), and
8 minutes with all 12. Our paper preset encodes exactly that: stall 180 s, out-after-stall 420 s,
R = 12, rejoin stall 0. The paper does not split the 7 minutes, nor count the ~100 s stall it
observed when the replica rejoined; the split below is ours and only the sum matters for the
paper preset. Setting ``rejoin_stall_s=100`` costs about 9 points (closed form 71%).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import random
from dataclasses import dataclass

#: the fields of each JSON line (`python -m bench.goodput --json`) and their types
FIELDS = {"scenario": str, "effective_training_pct": float, "closed_form_pct": float, "failures": int,
          "horizon_h": float, "seed": int, "parameters": dict}

# --- Figures from the paper (arXiv 2602.00277; section numbers are the paper's) -------------
PAPER_MTBF_S = 18 * 60.0  # §1/§4: one failure every ~18 minutes at 100K GPUs.
PAPER_SYNC_RESTART_S = 10 * 60.0  # §4: a synchronous restart at 100K GPUs takes ~10 minutes.
PAPER_REPLICAS = 12  # §7.1: 98K H100 as 12 replicas x 8,192 GPUs.
PAPER_DETECTION_S = 60.0  # §5.3: failures detected by a 60 s timeout (step ~20 s).
# §7.1: the whole job stalled ~3 min per failure: 60 s timeout + a few seconds of FTAR rebuild +
# ~20 s retried step + 45 s power smoother + 45 s from a bug. 180 - 60 = 120 s here.
PAPER_REBUILD_S = 120.0
# §7.1 "full repair still takes 10 minutes" -> 7 min (420 s) out after the 3 min stall. Split (ours):
PAPER_SWAP_S = 300.0  # §4: allocating replacement GPUs takes up to ~5 minutes.
PAPER_CATCHUP_S = 20.0  # §5.5: fetching state is faster than one ~20 s step.
PAPER_FIRST_STEP_S = 100.0  # §7.1: ~100 s of first-step effect when the replica rejoined.
# §7.1: after fixing the power smoother and the bug, the stall "should be ~1.5 minutes".
PAPER_FIXED_REBUILD_S = 30.0


@dataclass(frozen=True)
class Cause:
    """A failure category: its weight in the mix and whether it takes its host down."""

    name: str
    count: int
    kills_host: bool


# Table 1 (§3.2): interruptions of a ~32K-GPU job, 678 in all. Host-killing: our reading of
# which causes need the host replaced or rebooted; watchdog timeouts and software bugs only
# need the trainer process restarted.
PAPER_TABLE1 = (
    Cause("gpu_hbm3_memory", 155, True),
    Cause("pcie_device", 122, True),
    Cause("nccl_watchdog_timeout", 61, False),
    Cause("gpu_compute", 50, True),
    Cause("software_bug", 48, False),
    Cause("host_maintenance", 42, True),
    Cause("kernel_fault", 39, True),
    Cause("system_reboot", 38, True),
    Cause("numerics_sdc", 37, True),
    Cause("network_switch_cable", 36, True),
    Cause("ssd", 30, True),
    Cause("other", 20, True),
)


def _check(name: str, value: float, *, positive: bool = False) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}.")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}.")


@dataclass(frozen=True)
class SyncParams:
    """Synchronous restart: every failure stops everyone for ``restart_s``."""

    mtbf_s: float = PAPER_MTBF_S
    restart_s: float = PAPER_SYNC_RESTART_S

    def validate(self) -> None:
        _check("mtbf_s", self.mtbf_s, positive=True)
        _check("restart_s", self.restart_s)


@dataclass(frozen=True)
class FtParams:
    """FT-HSDP: only the failed replica stops, after a whole-job stall of detection + rebuild.

    ``spares=None`` means an unlimited warm pool; otherwise a host-killing failure waits for a
    free spare, and the failed host rejoins the pool ``host_repair_s`` after it failed.
    """

    mtbf_s: float = PAPER_MTBF_S
    replicas: int = PAPER_REPLICAS
    detection_s: float = PAPER_DETECTION_S
    rebuild_s: float = PAPER_REBUILD_S
    swap_s: float = PAPER_SWAP_S
    restart_s: float = PAPER_SWAP_S  # the paper does not distinguish process from host failures
    catchup_s: float = PAPER_CATCHUP_S
    first_step_s: float = PAPER_FIRST_STEP_S
    rejoin_stall_s: float = 0.0
    spares: int | None = None
    host_repair_s: float = 24 * 3600.0  # ours: a failed host is back in the pool within a day

    def validate(self) -> None:
        _check("mtbf_s", self.mtbf_s, positive=True)
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"replicas must be an integer of at least 1, got {self.replicas!r}.")
        for name in ("detection_s", "rebuild_s", "swap_s", "restart_s", "catchup_s",
                     "first_step_s", "rejoin_stall_s", "host_repair_s"):
            _check(name, getattr(self, name))
        if self.spares is not None and (not isinstance(self.spares, int) or self.spares < 0):
            raise ValueError(f"spares must be None or a non-negative integer, got {self.spares!r}.")

    @property
    def stall_s(self) -> float:
        return self.detection_s + self.rebuild_s


@dataclass(frozen=True)
class Failure:
    time_s: float
    cause: Cause
    replica: int


@dataclass(frozen=True)
class Result:
    effective_training: float  # fraction in [0, 1]
    failures: int


def sample_failures(rng: random.Random, mtbf_s: float, horizon_s: float, replicas: int = 1,
                    causes: tuple[Cause, ...] = PAPER_TABLE1) -> list[Failure]:
    """Poisson failure times in [0, horizon_s), each with a cause and a replica."""
    _check("mtbf_s", mtbf_s, positive=True)
    _check("horizon_s", horizon_s, positive=True)
    if not causes or any(c.count < 0 for c in causes) or sum(c.count for c in causes) <= 0:
        raise ValueError(f"causes must have non-negative counts with a positive sum, got {causes!r}.")
    weights = [c.count for c in causes]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(1.0 / mtbf_s)
        if t >= horizon_s:
            return out
        cause = rng.choices(causes, weights)[0]
        out.append(Failure(t, cause, rng.randrange(replicas)))


def covered_s(intervals: list[tuple[float, float]], horizon_s: float) -> float:
    """Length of the union of [start, end) intervals, clipped to [0, horizon_s)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        start, end = max(start, 0.0), min(end, horizon_s)
        if end <= start:
            continue
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _queued_stalls(times: list[float], duration_s: float) -> list[tuple[float, float]]:
    """Each event stops the job for duration_s, starting when the previous stop has ended."""
    stalls, busy_until = [], 0.0
    for t in times:
        start = max(t, busy_until)
        busy_until = start + duration_s
        stalls.append((start, busy_until))
    return stalls


def simulate_sync(failures: list[Failure], params: SyncParams, horizon_s: float) -> Result:
    params.validate()
    _check("horizon_s", horizon_s, positive=True)
    stalls = _queued_stalls([f.time_s for f in failures], params.restart_s)
    return Result(1.0 - covered_s(stalls, horizon_s) / horizon_s, len(failures))


def simulate_ft(failures: list[Failure], params: FtParams, horizon_s: float) -> Result:
    params.validate()
    _check("horizon_s", horizon_s, positive=True)
    stalls = _queued_stalls([f.time_s for f in failures], params.stall_s)
    pool = [0.0] * params.spares if params.spares is not None else None  # times spares free up
    out: list[list[tuple[float, float]]] = [[] for _ in range(params.replicas)]
    for f, (_, stall_end) in zip(failures, stalls):
        if not f.cause.kills_host:
            ready = stall_end + params.restart_s
        elif pool is None:
            ready = stall_end + params.swap_s
        elif pool:
            free_at = heapq.heappop(pool)  # the spare joins the replica for good ...
            heapq.heappush(pool, f.time_s + params.host_repair_s)  # ... the repaired host replaces it
            ready = max(stall_end, free_at) + params.swap_s
        else:  # no warm pool at all: wait for this very host to be repaired
            ready = max(stall_end, f.time_s + params.host_repair_s) + params.swap_s
        back = ready + params.catchup_s + params.first_step_s
        out[f.replica].append((f.time_s, back))
    rejoins = [(end, end + params.rejoin_stall_s) for iv in out for _, end in iv]
    all_stalls = stalls + rejoins
    lost = sum(covered_s(all_stalls + iv, horizon_s) for iv in out)
    return Result(1.0 - lost / (params.replicas * horizon_s), len(failures))


def host_share(causes: tuple[Cause, ...] = PAPER_TABLE1) -> float:
    return sum(c.count for c in causes if c.kills_host) / sum(c.count for c in causes)


def closed_form_sync(params: SyncParams) -> float:
    params.validate()
    return 1.0 - params.restart_s / params.mtbf_s


def closed_form_ft(params: FtParams, causes: tuple[Cause, ...] = PAPER_TABLE1) -> float:
    """Expected effective training ignoring overlaps and an empty spare pool."""
    params.validate()
    h = host_share(causes)
    after_stall = h * params.swap_s + (1 - h) * params.restart_s + params.catchup_s + params.first_step_s
    per_failure = params.stall_s + params.rejoin_stall_s + after_stall / params.replicas
    return 1.0 - per_failure / params.mtbf_s


PAPER_FT = FtParams()
PAPER_FT_FIXED = dataclasses.replace(PAPER_FT, rebuild_s=PAPER_FIXED_REBUILD_S)
# This project's own numbers where one machine can measure them, scaled by stated
# assumptions where it cannot (2026-11-29, 2-core machine; see the closing note of issue 8):
#   detection_s 10: the default heartbeat timeout, which bounds host failures (the demo saw
#     2.8 s with a 3 s timeout); a dead trainer process is reported by its agent in 0.07 s.
#   rebuild_s 20: survivors re-form the quorum (p99 30 ms at 12 x 8,192, bench.scale) and
#     rebuild FTAR rings (4-9 ms), then retry the one failed step: one ~20 s step at scale.
#   swap_s / restart_s 60: ASSUMED. A warm spare is ready in 0.014 s here (bench.swap) and no
#     allocation waits, but restarting a replica's 8,192 processes is not measurable here.
#   catchup_s 0.5: ~0.8 GB of state per rank at 1.8 GB/s (bench.overhead catchup_gbs).
#   first_step_s 10: ASSUMED; pre-initialisation took a warm standby's start from 3.5 s to
#     0.04 s in the demo, against the paper's ~100 s first-step effect.
MEASURED_IS_PLACEHOLDER = False
MEASURED_FT = dataclasses.replace(PAPER_FT, detection_s=10.0, rebuild_s=20.0, swap_s=60.0, restart_s=60.0,
                                  catchup_s=0.5, first_step_s=10.0)


def scenarios() -> list[tuple[str, SyncParams | FtParams]]:
    return [
        ("sync_paper", SyncParams()),
        ("ft_hsdp_paper", PAPER_FT),
        ("ft_hsdp_paper_fixed", PAPER_FT_FIXED),
        ("ft_hsdp_measured", MEASURED_FT),
    ]


def run_scenario(name: str, params: SyncParams | FtParams, seed: int, horizon_h: float) -> dict:
    horizon_s = horizon_h * 3600.0
    rng = random.Random(seed)
    if isinstance(params, SyncParams):
        failures = sample_failures(rng, params.mtbf_s, horizon_s)
        result, expected = simulate_sync(failures, params, horizon_s), closed_form_sync(params)
    else:
        failures = sample_failures(rng, params.mtbf_s, horizon_s, params.replicas)
        result, expected = simulate_ft(failures, params, horizon_s), closed_form_ft(params)
    row = {
        "scenario": name,
        "effective_training_pct": round(100 * result.effective_training, 2),
        "closed_form_pct": round(100 * expected, 2),
        "failures": result.failures,
        "horizon_h": horizon_h,
        "seed": seed,
        "parameters": dataclasses.asdict(params),
    }
    if name == "ft_hsdp_measured" and MEASURED_IS_PLACEHOLDER:
        row["placeholder"] = True
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--horizon-h", type=float, default=5000.0)
    args = parser.parse_args(argv)
    for name, params in scenarios():
        row = run_scenario(name, params, args.seed, args.horizon_h)
        if args.json:
            print(json.dumps(row, sort_keys=True))
        else:
            print(f"{name:22s} {row['effective_training_pct']:6.2f}%  (closed form "
                  f"{row['closed_form_pct']:.2f}%, {row['failures']} failures in {args.horizon_h:g} h)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
