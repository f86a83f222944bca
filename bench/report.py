"""The tables of a `fthsdp bench` report and the change between two reports (pure: rows in, text
out; bench/suite.py reads and writes the files).

A report's rows are the lines of its `results.jsonl`: {"bench": NAME, ...where it ran...,
"result": the benchmark's JSON line} for a result, "error" for a benchmark that failed, "note"
for something said about a benchmark (torchft not installed). A *figure* is one number of one
result, named by its benchmark, the fields that tell its results apart (FIGURES: the message
size and world of an FTAR point, the replica count of a quorum point...) and its field;
`compare` pairs the figures of two reports by that name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.common import size_text

HIGHER, LOWER = 1, -1
#: per benchmark: the fields that tell its results apart, and each figure compared (whether
#: higher or lower is better)
FIGURES: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {
    "quorum": (("replicas",), {"p50_ms": LOWER, "p99_ms": LOWER, "stream_p50_ms": LOWER, "report_p50_ms": LOWER,
                               "torchft_lighthouse_p50_ms": LOWER, "ratio_p50": LOWER}),
    "ftar": (("world", "bytes"), {"ftar_busbw_gbs": HIGHER, "gloo_busbw_gbs": HIGHER, "tcp_busbw_gbs": HIGHER,
                                  "ratio": HIGHER, "ftar_busbw_of_limit": HIGHER}),
    "limits": ((), {"tcp_one_stream_gbs": HIGHER, "tcp_two_stream_gbs": HIGHER, "memcpy_gbs": HIGHER,
                    "add_gbs": HIGHER}),
    "overhead": ((), {"step_ms_plain": LOWER, "step_ms_ft": LOWER, "overhead_pct": LOWER, "catchup_gbs": HIGHER,
                      "tcp_one_stream_gbs": HIGHER, "catchup_of_limit": HIGHER}),
    "recovery": (("case",), {"detection_s": LOWER, "survivor_stall_s": LOWER, "replica_down_s": LOWER,
                             "lost_replica_s": LOWER}),
    "failover": ((), {"failover_s": LOWER, "spurious_deaths": LOWER}),
    "swap": ((), {"swap_warm_s": LOWER, "swap_cold_s": LOWER, "replica_restart_s": LOWER}),
}


def read_results(folder: Path) -> list[dict]:
    """The rows of `folder`/results.jsonl; ValueError naming the folder or the bad line."""
    path = folder / "results.jsonl"
    if not path.is_file():
        raise ValueError(f"{folder} holds no results.jsonl: give a folder `fthsdp bench --out` wrote")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {number} is not JSON: {exc}") from None
    return rows


def results_of(rows: list[dict]) -> dict[str, list[dict]]:
    """The benchmarks' own lines, by benchmark."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        if "result" in row:
            out.setdefault(row["bench"], []).append(row["result"])
    return out


# -- the tables --------------------------------------------------------------------------------

def markdown(rows: list[dict]) -> str:
    """report.md: where it ran, then a table per benchmark that gave results, notes and errors."""
    results = results_of(rows)
    parts = [_header(rows)]
    for bench, section in _SECTIONS.items():
        notes = [r["note"] for r in rows if r.get("bench") == bench and "note" in r]
        if bench in results:
            parts.append(section(results[bench]) + "".join(f"\n{n}\n" for n in notes))
    errors = [f"- {r['bench']}: {r['error']}" for r in rows if "error" in r]
    if errors:
        parts.append("## Failed\n\n" + "\n".join(errors) + "\n")
    return "\n".join(parts)


def _header(rows: list[dict]) -> str:
    if not rows:
        return "# fthsdp bench\n\nNo results.\n"
    first = rows[0]
    loads = [r["load"][0] for r in rows if r.get("load")]
    versions = ", ".join(f"{k} {v}" for k, v in first.get("versions", {}).items() if v)
    return (f"# fthsdp bench --suite {first.get('suite', '?')}\n\n"
            f"Host {first.get('host', '?')} ({first.get('cpus', '?')} CPUs, {first.get('platform', '?')}), "
            f"git {first.get('git', '?')}, {first.get('time', '?')}; {versions}; 1-minute load "
            f"{min(loads, default=0):g}-{max(loads, default=0):g} during the run. GB/s are 1e9 bytes per "
            f"second.\n")


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _quorum(results: list[dict]) -> str:
    rows = [[r["replicas"], r["p50_ms"], r["p99_ms"], r["stream_p50_ms"], r.get("torchft_lighthouse_p50_ms"),
             r.get("ratio_p50")] for r in sorted(results, key=lambda r: r["replicas"])]
    return ("## Quorum latency (`python -m bench.quorum`)\n\nA round: every replica's coordinator asks for the "
            "quorum of its next step at once; from the release to the last answer.\n\n"
            + table(["replicas", "p50 ms", "p99 ms", "stream p50 ms", "torchft lighthouse p50 ms",
                     "ratio p50 (ours / torchft)"], rows))


def _ftar(results: list[dict]) -> str:
    rows = []
    for r in sorted(results, key=lambda r: (r["world"], r["bytes"])):
        ftar_s, gloo_s = r["ftar_median_s"], r["gloo_median_s"]
        rows.append([size_text(r["bytes"]), r["bytes"] // 4, "float", "sum", r["world"], round(ftar_s * 1e6, 1),
                     round(r["bytes"] / ftar_s / 1e9, 3), r["ftar_busbw_gbs"], round(gloo_s * 1e6, 1),
                     round(r["bytes"] / gloo_s / 1e9, 3), r["gloo_busbw_gbs"], r["ratio"], r["tcp_busbw_gbs"],
                     r["ftar_busbw_of_limit"]])
    return ("## FTAR vs Gloo all-reduce (`python -m bench.ftar`)\n\nMedian times; algbw = size / time, busbw = "
            "algbw x 2(n-1)/n (as nccl-tests); ratio = Gloo's time / FTAR's (above 1: FTAR is faster); the TCP "
            "ring moves FTAR's bytes with no reduce: the ceiling.\n\n"
            + table(["size", "count", "type", "redop", "world", "FTAR time us", "FTAR algbw", "FTAR busbw",
                     "Gloo time us", "Gloo algbw", "Gloo busbw", "ratio", "TCP ring busbw", "FTAR of ceiling"],
                    rows))


def _limits(results: list[dict]) -> str:
    rows = [[r["tcp_one_stream_gbs"], r["tcp_two_stream_gbs"], r["memcpy_gbs"], r["add_gbs"]] for r in results]
    return ("## This machine's ceilings (`python -m bench.limits`)\n\n"
            + table(["one TCP stream GB/s", "two TCP streams GB/s each", "memcpy GB/s", "add_ GB/s"], rows))


def _overhead(results: list[dict]) -> str:
    rows = [[size_text(r["catchup_bytes"]) if "catchup_bytes" in r else None, r.get("catchup_s"), r.get("catchup_gbs"), r.get("tcp_one_stream_gbs"),
             r.get("catchup_of_limit")] for r in results]
    steps = [[r.get("replicas"), r.get("steps"), r.get("step_ms_plain"), r.get("step_ms_ft"), r.get("overhead_pct"),
              r.get("protocol_us_per_step")] for r in results]
    return ("## Catch-up against the loopback ceiling (`python -m bench.overhead`)\n\nA replica fetching a peer's "
            "state over loopback; the ceiling is one loopback TCP stream measured in the same run.\n\n"
            + table(["state", "seconds", "GB/s", "one TCP stream GB/s", "of ceiling"], rows)
            + "\n## Overhead against plain training (`python -m bench.overhead`)\n\nThe same model and data, "
            "step by step in alternation: plain torch.distributed (Gloo) and through fthsdp (quorum, FTAR, vote, "
            "commit).\n\n"
            + table(["replicas", "steps", "plain step ms", "fthsdp step ms", "overhead %", "protocol us/step"], steps))


def _recovery(results: list[dict]) -> str:
    rows = [[r["case"], r.get("detected_by"), r.get("detection_s"), r.get("step_period_s"), r.get("survivor_stall_s"),
             r.get("replica_down_s"), r.get("lost_replica_s"), r.get("error", "")] for r in results]
    return ("## Recovery (`python -m bench.recovery`)\n\nOne failure of replica r1 in a 3-replica job; seconds "
            "from the failure. Survivor stall: until every other replica committed again; replica down: until "
            "r1 trained again.\n\n"
            + table(["case", "detected by", "detection s", "step period s", "survivor stall s", "replica down s",
                     "lost replica-s", "error"], rows))


def _failover(results: list[dict]) -> str:
    rows = [[r["failover_s"], ", ".join(fmt(t) for t in r["trials"]), r["spurious_deaths"], r["lease_ttl_s"],
             r["heartbeat_timeout_s"]] for r in results]
    return ("## Controller failover (`python -m bench.failover`)\n\nThe leading controller SIGKILLed; until a "
            "replica's next quorum is answered by the new leader.\n\n"
            + table(["failover s (median)", "trials s", "spurious deaths", "lease TTL s", "heartbeat timeout s"],
                    rows))


def _swap(results: list[dict]) -> str:
    rows = [[r["swap_warm_s"], r["swap_cold_s"], r["replica_restart_s"], r["trials"]] for r in results]
    return ("## Spare swap and replica restart (`python -m bench.swap`)\n\n"
            + table(["warm swap s", "cold swap s", "replica restart s", "trials"], rows))


_SECTIONS = {"quorum": _quorum, "ftar": _ftar, "limits": _limits, "overhead": _overhead, "recovery": _recovery,
             "failover": _failover, "swap": _swap}


# -- two reports ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    figure: str
    old: float | None
    new: float | None
    #: HIGHER or LOWER: which way is better
    better: int

    @property
    def pct(self) -> float | None:
        if self.old is None or self.new is None or self.old == 0:
            return None
        return (self.new - self.old) / abs(self.old) * 100

    @property
    def verdict(self) -> str:
        if self.old is None or self.new is None:
            return "only in " + ("new" if self.old is None else "old")
        if self.new == self.old:
            return "same"
        return "better" if (self.new - self.old) * self.better > 0 else "worse"


def figures(rows: list[dict]) -> dict[str, tuple[float | None, int]]:
    """Every figure of a report: {name: (value, better)} (a repeated name keeps its first value)."""
    out: dict[str, tuple[float | None, int]] = {}
    for bench, results in results_of(rows).items():
        keys, metrics = FIGURES.get(bench, ((), {}))
        for r in results:
            where = " ".join(f"{k}={size_text(r[k]) if k == 'bytes' else r[k]}" for k in keys if k in r)
            for metric, better in metrics.items():
                if metric in r:
                    out.setdefault(" ".join(filter(None, [bench, where, metric])), (r[metric], better))
    return out


def compare(old_rows: list[dict], new_rows: list[dict]) -> list[Change]:
    """The change of every figure, in the new report's order, then those only the old one has."""
    old, new = figures(old_rows), figures(new_rows)
    names = list(new) + [n for n in old if n not in new]
    return [Change(n, old.get(n, (None, 0))[0], new.get(n, (None, 0))[0], (new.get(n) or old[n])[1]) for n in names]


def compare_text(changes: list[Change], old_name: str, new_name: str) -> str:
    rows = [[c.figure, c.old, c.new, "-" if c.pct is None else f"{c.pct:+.1f}%", c.verdict] for c in changes]
    worse = sum(c.verdict == "worse" for c in changes)
    return (table(["figure", old_name, new_name, "change", "verdict"], rows)
            + f"\n{len(changes)} figures: {sum(c.verdict == 'better' for c in changes)} better, {worse} worse, "
              f"{sum(c.verdict.startswith('only') for c in changes)} in one report only.")
