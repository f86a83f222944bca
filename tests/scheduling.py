"""How `make test` spreads the tests over its pytest-xdist workers (`--dist loadgroup`).

The tests that start torch trainers (TRAINER_FILES) are one unit of work: one worker runs them
one at a time, while the other workers take every other test, each a unit of its own. The end-to-end
runs in SOLO_FILES are marked `solo` and run after the rest, one at a time (tests/conftest.py).

pytest-xdist's own loadgroup reads an `xdist_group` mark into the test's node id by assigning
`item._nodeid`, which pytest 9 no longer reads: the mark silently did nothing, and the trainer
tests ran two at a time, each on cores the other needed. So the group is made here, in the
scheduler, from the file patterns.
"""

from __future__ import annotations

from fnmatch import fnmatch

from xdist.scheduler import LoadScopeScheduling

#: Test files whose tests start torch trainer processes (clusters, torchrun, the trainer
#: benchmarks): each keeps both cores busy, so they run one at a time on one worker.
TRAINER_FILES = ("tests/runtime/test_cluster_*.py", "tests/runtime/test_endings_*.py", "tests/runtime/test_race_rendezvous.py", "tests/runtime/test_example_gpt.py", "tests/runtime/test_torchrun.py",
                 "tests/runtime/test_fsdp_shards.py", "tests/runtime/test_gpu_hsdp.py",
                 "tests/runtime/test_deterministic_mode.py", "tests/runtime/test_compare_checkpoints.py",
                 "tests/bench/test_smoke_trainers.py", "tests/ha/test_semisync_failover.py",
                 "tests/bench/test_semisync_bench.py", "tests/chaos/test_trainer_end.py")
#: The end-to-end runs that start a dozen trainers at once (the demos, the diagnosis, chaos, the
#: DaemonSets): marked `solo`; `make test` runs them after the rest, one at a time, with the machine
#: to themselves. Beside the other worker a replica's trainers could take longer to import than
#: the run's schedule allows for.
SOLO_FILES = ("tests/demo/test_demo_cli.py", "tests/demo/test_demo_gpt.py", "tests/demo/test_diagnosis_end_to_end.py",
              "tests/chaos/test_chaos_run.py", "tests/chaos/test_net_run.py", "tests/deploy/test_daemonsets_on_loopback.py",
              "tests/bench/test_smoke_jobs.py", "tests/deploy/test_pool_on_loopback.py",
              "tests/deploy/test_jobset_on_loopback.py")

#: the unit of work of every test in TRAINER_FILES
TRAINERS = "trainers"


def is_in(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether the test file `path` (relative to the repository, with /) matches one of `patterns`."""
    return any(fnmatch(path, pattern) for pattern in patterns)


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: TRAINERS for the trainer files, else the test itself."""
    return TRAINERS if is_in(nodeid.split("::", 1)[0], TRAINER_FILES) else nodeid


class TrainersOnOneWorker(LoadScopeScheduling):
    """xdist's load-by-scope scheduling with `scope_of` as the scope: the largest unit, the
    trainers, goes to the first worker; the single tests are handed out as workers free up."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
