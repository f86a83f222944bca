"""The benchmark that runs a whole job of trainers (bench.recovery: the demo's job with one
failure), at its smallest size: it runs and prints the fields it declares (tests/bench/smoke.py).
`solo` (tests/scheduling.py): the machine to itself. (bench.chaos, the other such benchmark, runs
as tests/chaos/test_chaos_run.py's seed.)"""

from __future__ import annotations

import pytest

from tests.bench import smoke


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", smoke.group(smoke.SOLO))
def test_the_job_benchmark_runs_at_a_tiny_size_and_prints_its_declared_fields(name):
    lines = smoke.check(name)
    if name == "recovery":  # the failure really was injected and measured
        assert lines[0]["case"] == "kill-rank" and "error" not in lines[0]
