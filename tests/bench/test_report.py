"""The report of `fthsdp bench` and the comparison of two (pure: made-up results, no speed)."""

from __future__ import annotations

import json

import pytest

from bench import plots, report, suite

WHERE = {"suite": "quick", "host": "h", "cpus": 2, "platform": "Linux", "versions": {"python": "3.11"}, "git": "abc",
         "load": [1.0, 1.0, 1.0], "time": "2026-12-07T00:00:00Z"}


def ftar(nbytes: int, ftar_s: float, gloo_s: float, world: int = 2) -> dict:
    factor = nbytes * 2 * (world - 1) / world / 1e9
    return {"bench": "ftar", **WHERE, "result": {
        "world": world, "bytes": nbytes, "ftar_median_s": ftar_s, "gloo_median_s": gloo_s,
        "ftar_busbw_gbs": round(factor / ftar_s, 3), "gloo_busbw_gbs": round(factor / gloo_s, 3),
        "ratio": round(gloo_s / ftar_s, 3), "tcp_busbw_gbs": 2.0, "ftar_busbw_of_limit": 0.9}}


def quorum(replicas: int, p50: float) -> dict:
    return {"bench": "quorum", **WHERE, "result": {"replicas": replicas, "p50_ms": p50, "p99_ms": p50 * 2,
                                                   "stream_p50_ms": p50 * 1.5, "report_p50_ms": 1.0}}


def recovery(case: str, down: float | None) -> dict:
    return {"bench": "recovery", **WHERE, "result": {
        "case": case, "detected_by": "exit", "detection_s": 0.5, "step_period_s": 0.5, "survivor_stall_s": 1.0,
        "replica_down_s": down, "lost_replica_s": 3.0}}


OLD = [quorum(2, 1.0), quorum(8, 2.0), ftar(1 << 20, 0.002, 0.004), ftar(16 << 20, 0.02, 0.03),
       recovery("kill-rank", 4.0), {"bench": "failover", **WHERE, "result": {
           "failover_s": 1.5, "trials": [1.5, 1.4], "spurious_deaths": 0, "lease_ttl_s": 1.0,
           "heartbeat_timeout_s": 2.0}},
       {"bench": "quorum", **WHERE, "note": "torchft's lighthouse not measured: torchft is not installed"}]


def test_the_ftar_table_has_the_nccl_tests_columns_and_its_own_arithmetic():
    text = report.markdown(OLD)
    assert "| size | count | type | redop | world | FTAR time us | FTAR algbw | FTAR busbw | Gloo time us |" in text
    # 1 MiB in 2 ms: algbw 0.524 GB/s, busbw the same at 2 ranks; Gloo in 4 ms: ratio 2
    assert "| 1MiB | 262144 | float | sum | 2 | 2000 | 0.524 | 0.524 | 4000 | 0.262 | 0.262 | 2 | 2 | 0.9 |" in text
    assert "| 16MiB | 4194304 |" in text


def test_the_report_names_where_it_ran_each_command_and_what_was_not_measured():
    text = report.markdown(OLD + [{"bench": "swap", **WHERE, "error": "python -m bench.swap: exit status 1"}])
    assert text.startswith("# fthsdp bench --suite quick\n\nHost h (2 CPUs, Linux), git abc")
    for command in ("bench.quorum", "bench.ftar", "bench.recovery", "bench.failover"):
        assert f"`python -m {command}`" in text
    assert "torchft's lighthouse not measured: torchft is not installed" in text
    assert "| 2 | 1 | 2 | 1.5 | - | - |" in text  # quorum: no torchft columns measured
    assert "| kill-rank | exit | 0.5 | 0.5 | 1 | 4 | 3 |" in text
    assert "## Failed\n\n- swap: python -m bench.swap: exit status 1" in text


def test_compare_names_every_figure_its_change_and_whether_it_is_better():
    new = [quorum(2, 1.5), ftar(1 << 20, 0.001, 0.004), ftar(16 << 20, 0.02, 0.03), recovery("kill-rank", None),
           recovery("hang-rank", 6.0)]
    changes = {c.figure: c for c in report.compare(OLD, new)}
    p50 = changes["quorum replicas=2 p50_ms"]
    assert (p50.old, p50.new, round(p50.pct, 1), p50.verdict) == (1.0, 1.5, 50.0, "worse")
    busbw = changes["ftar world=2 bytes=1MiB ftar_busbw_gbs"]
    assert (busbw.old, busbw.new, busbw.verdict) == (0.524, 1.049, "better")
    assert changes["ftar world=2 bytes=16MiB ratio"].verdict == "same"
    assert changes["quorum replicas=8 p50_ms"].verdict == "only in old"
    assert changes["recovery case=hang-rank replica_down_s"].verdict == "only in new"
    assert changes["recovery case=kill-rank replica_down_s"].pct is None  # it did not come back in the new run
    text = report.compare_text(list(changes.values()), "OLD", "NEW")
    assert "| quorum replicas=2 p50_ms | 1 | 1.5 | +50.0% | worse |" in text
    assert text.endswith(f"{len(changes)} figures: " + f"{sum(c.verdict == 'better' for c in changes.values())} better, "
                         f"{sum(c.verdict == 'worse' for c in changes.values())} worse, "
                         f"{sum(c.verdict.startswith('only') for c in changes.values())} in one report only.")


def write(folder, rows) -> None:
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_fthsdp_bench_compare_reads_two_report_folders(tmp_path, capsys):
    write(tmp_path / "old", OLD)
    write(tmp_path / "new", [quorum(2, 0.5)])
    assert suite.main(["--compare", str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    out = capsys.readouterr().out
    assert "| quorum replicas=2 p50_ms | 1 | 0.5 | -50.0% | better |" in out
    assert f"| figure | {tmp_path / 'old'} | {tmp_path / 'new'} | change | verdict |" in out


def test_a_folder_without_results_or_with_a_broken_line_is_refused_by_name(tmp_path, capsys):
    write(tmp_path / "good", OLD)
    with pytest.raises(SystemExit) as exit_:
        suite.main(["--compare", str(tmp_path / "good"), str(tmp_path / "nowhere")])
    assert exit_.value.code == 2 and f"{tmp_path / 'nowhere'} holds no results.jsonl" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.jsonl").write_text(json.dumps(OLD[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"results.jsonl line 2 is not JSON"):
        report.read_results(tmp_path / "bad")


def test_the_plots_are_png_files(tmp_path):
    written = plots.write_all(report.results_of(OLD), tmp_path)
    assert sorted(p.name for p in written) == ["ftar_busbw.png", "quorum_latency.png", "recovery_timeline.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
