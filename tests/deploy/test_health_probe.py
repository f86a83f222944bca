"""fthsdp-grpc-health (deploy/images/grpc_health_probe.py) against an in-process health server."""

from __future__ import annotations

import importlib.util
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.sockets import refused_address

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "images" / "grpc_health_probe.py"
_spec = importlib.util.spec_from_file_location("grpc_health_probe", SCRIPT)
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


@pytest.fixture
def server():
    servicer = health.HealthServicer()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield servicer, f"127.0.0.1:{port}"
    srv.stop(grace=None)


def test_serving_exits_zero_and_not_serving_exits_one(server, capsys):
    servicer, addr = server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert probe.main([f"--addr={addr}"]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # a standby controller
    assert probe.main([f"--addr={addr}"]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err


def test_named_service_and_unknown_service(server):
    servicer, addr = server
    servicer.set("fthsdp.v1.Controller", health_pb2.HealthCheckResponse.SERVING)
    assert probe.check(addr, "fthsdp.v1.Controller")[0] is True
    serving, line = probe.check(addr, "no.such.Service")
    assert serving is False and "NOT_FOUND" in line


def test_unreachable_server_is_not_serving():
    serving, line = probe.check(refused_address(), timeout_s=1.0)
    assert serving is False
    assert "UNAVAILABLE" in line or "DEADLINE_EXCEEDED" in line


def test_usage_errors_exit_two():
    with pytest.raises(SystemExit) as err:
        probe.main(["--addr=127.0.0.1:1", "--cert-file=x"])
    assert err.value.code == 2
