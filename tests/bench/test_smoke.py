"""Every benchmark runs at its smallest size and prints the fields it declares (tests/bench/smoke.py
holds the table); a benchmark module without a row fails here, and so does a field renamed in
its output without its declaration. No speed is asserted: only that each figure is there."""

from __future__ import annotations

import ast
import importlib
import json

import pytest

from bench.common import fields_problems
from tests.bench import smoke


def _runnable_modules() -> set[str]:
    """bench/*.py with an `if __name__ == "__main__":` block: what a user runs as python -m bench.X."""
    names = set()
    for path in (smoke.ROOT / "bench").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                names.add(path.stem)
    return names


def test_every_runnable_benchmark_has_a_smoke_run_and_declares_the_fields_its_docstring_lists():
    runnable = _runnable_modules()
    assert "swap" in runnable and "ftar" in runnable  # the walk finds them
    assert runnable == set(smoke.SMOKE), (f"benchmarks without a smoke run: {sorted(runnable - set(smoke.SMOKE))}; "
                                          f"rows for no benchmark: {sorted(set(smoke.SMOKE) - runnable)}")
    for name in sorted(runnable):
        module = importlib.import_module(f"bench.{name}")
        declared = dict(module.FIELDS, **getattr(module, "SUMMARY_FIELDS", {}))
        assert declared, f"bench.{name}.FIELDS is empty"
        unlisted = [field for field in declared if field not in module.__doc__]
        assert not unlisted, f"bench.{name}'s docstring does not list its fields {unlisted}"


def test_a_line_with_a_renamed_or_retyped_field_does_not_pass_for_the_declared_one():
    from bench import swap

    line = {"swap_warm_s": 0.1, "swap_cold_s": 2, "replica_restart_s": 1.5, "trials": 3, "weights_mb": 256}
    assert fields_problems(line, swap.FIELDS) == []  # an int passes for a float
    renamed = {("warm_swap_s" if k == "swap_warm_s" else k): v for k, v in line.items()}
    assert fields_problems(renamed, swap.FIELDS) == ["swap_warm_s is missing"]
    assert fields_problems({**line, "trials": 3.0}, swap.FIELDS) == ["trials is 3.0 (float), not int"]
    assert fields_problems({**line, "swap_cold_s": None}, swap.FIELDS) == ["swap_cold_s is None (NoneType), not float"]
    from bench import recovery

    assert "replica_down_s is" not in " ".join(fields_problems({"replica_down_s": None}, recovery.FIELDS))


@pytest.mark.parametrize("name", smoke.group(smoke.LIGHT))
def test_the_benchmark_runs_at_a_tiny_size_and_prints_its_declared_fields(name):
    smoke.check(name)


def test_the_gpu_benchmark_refuses_clearly_without_a_gpu_or_runs_with_one():
    import torch

    from bench import ftar_gpu

    why = ftar_gpu._no_device(torch)
    if not why:  # a CUDA device and CuPy: the smallest real run
        lines = smoke.check("ftar_gpu")
        assert {line["what"] for line in lines} == {"kernel", "allreduce", "runtime"}
        assert all(line["correct"] for line in lines)
        return
    proc = smoke.run("ftar_gpu")
    assert proc.returncode == ftar_gpu.NO_DEVICE, proc
    assert proc.stdout == "" and why in proc.stderr and "nothing measured" in proc.stderr, proc.stderr
    assert json.dumps(ftar_gpu.NO_DEVICE) == "3"
