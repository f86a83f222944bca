"""The benchmarks that start torch trainers (a controller and a Manager per replica), at their
smallest size: they run and print the fields they declare (tests/bench/smoke.py). They run on
the "trainers" pytest worker group (tests/scheduling.py)."""

from __future__ import annotations

import pytest

from tests.bench import smoke


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", smoke.group(smoke.TRAINERS))
def test_the_trainer_benchmark_runs_at_a_tiny_size_and_prints_its_declared_fields(name):
    smoke.check(name)
