"""Diagnosis settings: nested in the controller's JSON file, validated with the bad value named."""

from __future__ import annotations

import json

import pytest

from controller.main import build_server, parse_args
from controller.settings import ControllerSettings
from controller.core.diagnosis.settings import DiagnosisSettings


def test_the_settings_file_nests_diagnosis(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"replicas": 4, "diagnosis": {"hang_after_s": 2.5, "dry_run": True}}))
    s = ControllerSettings.from_file(path)
    assert s.diagnosis == DiagnosisSettings(hang_after_s=2.5, dry_run=True) and s.replicas == 4
    path.write_text(json.dumps({"diagnosis": {"hang_after": 1}}))
    with pytest.raises(ValueError, match="unknown keys under diagnosis: hang_after"):
        ControllerSettings.from_file(path)


@pytest.mark.parametrize("field, value, text", [
    ("hang_after_s", 0, "diagnosis.hang_after_s must be positive, got 0"),
    ("straggler_windows", 6, "straggler_windows (6) must be at least 1 and at most straggler_of_windows (5)"),
    ("straggler_min_span_s", -1.0, "diagnosis.straggler_min_span_s must be 0..3600 s, got -1.0"),
    ("straggler_min_span_s", float("nan"), "diagnosis.straggler_min_span_s must be 0..3600 s, got nan"),
    ("straggler_min_excess_s", 61, "diagnosis.straggler_min_excess_s must be 0..60 s, got 61"),
    ("min_confidence", 1.5, "diagnosis.min_confidence must be 0..1, got 1.5"),
    ("max_evictions_per_hour", -1, "must not be negative, got -1"),
    ("sdc_evict_after", 0, "diagnosis.sdc_evict_after must be at least 1, got 0"),
])
def test_bad_values_are_named(field, value, text):
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        ControllerSettings(diagnosis=DiagnosisSettings(**{field: value})).validate()


def test_the_dry_run_flag(tmp_path):
    server = build_server(parse_args(["--grpc-port", "0", "--http-port", "0", "--diagnosis-dry-run", "--insecure"]))
    assert server.settings.diagnosis.dry_run
    assert not build_server(parse_args(["--grpc-port", "0", "--http-port", "0", "--insecure"])).settings.diagnosis.dry_run
