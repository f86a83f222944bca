"""The test suite's own scheduling (tests/scheduling.py): the trainer tests really share one
xdist worker, and every file pattern still names a file."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.scheduling import SOLO_FILES, TRAINER_FILES, TRAINERS, scope_of

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("pattern", TRAINER_FILES + SOLO_FILES)
def test_every_pattern_names_a_test_file(pattern):
    assert list(ROOT.glob(pattern)), f"{pattern} matches no file: renamed or removed?"


def test_a_trainer_test_is_in_the_trainers_unit_and_any_other_test_is_its_own():
    assert scope_of("tests/runtime/test_cluster_fsdp.py::test_x[a@b]") == TRAINERS
    assert scope_of("tests/bench/test_semisync_bench.py::test_y") == TRAINERS
    other = "tests/controller/test_ready.py::test_pending_writes_order_and_urgency"
    assert scope_of(other) == other


def test_two_workers_run_the_trainer_files_tests_on_one_of_them(tmp_path):
    """A real `pytest -n 2 --dist loadgroup` over a trainer file's quick tests and a light file:
    every test of the trainer file is reported by one worker (before tests/scheduling.py the
    xdist_group mark did nothing under pytest 9 and they went to both)."""
    trainer_file, light_file = "tests/bench/test_semisync_bench.py", "tests/controller/test_ready.py"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-v",
         "-o", "addopts=", "-k", "not slowed_link and not torchft", trainer_file, light_file],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers = defaultdict(set)
    for worker, path in re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+?\.py)::", run.stdout, re.M):
        workers[path].add(worker)
    assert workers[trainer_file] and len(workers[trainer_file]) == 1, dict(workers)
    assert workers[light_file], run.stdout[-3000:]
