"""bench.diagnosis at a small scale: the synthetic job, its faults and the scoring hold together
(the full 32,768-rank run is the benchmark; no timing is asserted here)."""

from __future__ import annotations

import json

from bench import diagnosis


def test_small_run_finds_the_injected_faults(capsys):
    assert diagnosis.main(["--ranks", "1024", "--replicas", "8", "--faults", "48", "--seed", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["ranks"], out["hosts"], out["faults"]) == (1024, 128, 48)
    assert out["accuracy_pct"] >= 95 and out["in_candidates_pct"] >= out["accuracy_pct"]
    assert set(out["accuracy_by_kind_pct"]) == {"hang-not-joined", "hang-no-progress", "straggler", "sdc"}
    assert out["false_findings"] <= 1 and out["telemetry_bytes_per_rank"] < 1 << 20
    assert 0 < out["summary_bytes_per_rank"] < 1024


def test_ranks_must_fill_whole_hosts(capsys):
    assert diagnosis.main(["--ranks", "1000", "--replicas", "8"]) == 2
    assert "multiple of replicas x 8" in capsys.readouterr().err
