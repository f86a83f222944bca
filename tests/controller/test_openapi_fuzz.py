"""schemathesis against the controller's own OpenAPI: no 5xx, no schema violations."""

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from controller.launch import launch

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg

ST = Path(sys.executable).with_name("st")


@pytest.mark.slow
def test_rest_api_survives_schemathesis(tmp_path):
    token = tmp_path / "admin-token"
    token.write_text("fuzz-token\n")
    ctl = launch("--replicas", "2", "--admin-token-file", str(token), insecure=True)
    info = {"grpc": ctl.grpc, "http": ctl.http}
    try:
        with grpc.insecure_channel(info["grpc"]) as channel:  # give the admin routes a real host to act on
            stub = pbg.ControllerStub(channel)
            for host, spare in (("h1", False), ("s1", True)):
                stub.RegisterAgent(pb.RegisterAgentRequest(
                    host_id=host, incarnation="i1", spare=spare,
                    assignment=None if spare else pb.Assignment(replica_id="r1", ranks=[0], world_size=1)), timeout=10)
        out = subprocess.run(
            [str(ST if ST.exists() else shutil.which("st")), "run", f"{info['http']}/openapi.json", "--checks", "all",
             "-H", "Authorization: Bearer fuzz-token", "--max-examples", "10", "--seed", "1", "--no-color"],
            capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        assert " passed" in out.stdout
    finally:
        ctl.stop()
