"""tests/forked.py's `popen`, which tests/conftest.py gives controller/launch.py: a controller is
forked from the server only where the fork is the same as a start (same network namespace, same
exec-time environment); elsewhere it starts as usual."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from controller.launch import launch
from tests import forked
from tests.chaos.network import Network


def _namespace(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def test_a_controller_is_forked_from_the_server_and_serves():
    ctl = launch(insecure=True, spawner=forked.popen)
    try:
        assert isinstance(ctl.proc, forked.Forked)
        assert ctl.proc.poll() is None and _namespace(ctl.pid) == _namespace("self")
    finally:
        assert ctl.stop() == 0


def test_a_controller_launched_inside_another_network_namespace_lives_there():
    """The chaos and clock-skew tests start a controller from a thread inside a node's namespace.
    Forked from the server (which lives in the process's namespace) it would live outside the
    node, unreachable at the node's address; and had the server been started from that thread,
    every later controller of the test process would have lived in the node's namespace (a full
    run failed 53 tests on one worker that way)."""
    forked.popen([sys.executable, "-m", "json.tool", "--help"], stdout=subprocess.PIPE, text=True).wait(60)
    with Network() as net:
        net.add("c")
        with net.entered("c"):
            inside = os.stat("/proc/thread-self/ns/net").st_ino
            ctl = launch(insecure=True, spawner=forked.popen)
        try:
            assert not isinstance(ctl.proc, forked.Forked)
            assert _namespace(ctl.pid) == inside != _namespace("self")
        finally:
            assert ctl.stop() == 0


def test_forked_start_refuses_a_thread_inside_another_network_namespace(tmp_path):
    with Network() as net:
        net.add("c")
        with net.entered("c"), pytest.raises(RuntimeError, match="another network namespace"):
            forked.start("json.tool", ["--help"], log=tmp_path / "log", env=dict(os.environ), cwd=tmp_path)


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "FAKETIME"])
def test_an_environment_only_an_exec_reads_starts_the_controller_as_usual(name):
    ctl = launch(insecure=True, spawner=forked.popen, env={**os.environ, name: "/nonexistent"})
    try:
        assert not isinstance(ctl.proc, forked.Forked)
        with open(f"/proc/{ctl.pid}/environ", "rb") as f:
            assert f"{name}=/nonexistent".encode() in f.read().split(b"\0")
    finally:
        assert ctl.stop() == 0
