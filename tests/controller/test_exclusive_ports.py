"""Listeners never share a port (issue 39, finding 1): a second `fthsdp controller` on a port
another one holds exits at once naming the port and its flag, and the first one still serves."""

from __future__ import annotations

import socket
import subprocess
import sys

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1].strip("/"))


def _second_controller(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--insecure", "--grpc-port", "0",
                           "--http-port", "0", *flags], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _still_serves(ctl) -> None:
    assert httpx.get(f"{ctl.http}/api/v1/job", timeout=10).status_code == 200
    with grpc.insecure_channel(ctl.grpc) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("flag", ["--grpc-port", "--http-port", "--quorum-port"])
def test_a_second_controller_on_a_taken_port_exits_naming_the_port(controller_process, flag):
    first = controller_process("--job-id", "one")
    port = {"--grpc-port": _port(first.grpc), "--http-port": _port(first.http),
            "--quorum-port": _port(first.quorum)}[flag]
    out = _second_controller("--job-id", "two", flag, str(port))
    assert out.returncode == 2, out.stderr
    assert f"fthsdp controller: {flag} {port} is already in use by another process" in out.stderr
    assert "Traceback" not in out.stderr and "Event loop is closed" not in out.stderr, out.stderr
    assert "Failed to" not in out.stderr, out.stderr  # nor gRPC's own bind error beside ours
    assert out.stdout == ""  # never announced itself as serving
    _still_serves(first)


def test_the_port_problem_is_learnt_from_a_bind():
    from controller.service.server import PortInUse, listen_problem

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        problem = listen_problem("grpc", "127.0.0.1", port)
    assert isinstance(problem, PortInUse) and problem.in_use and problem.port == port
    assert str(problem) == f"the grpc port {port} on 127.0.0.1 is already in use by another process"
