"""The committed generated modules are exactly what protoc makes from the .proto today."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("controller_pb2.py", "controller_pb2_grpc.py", "controller_pb2.pyi")


def test_generated_modules_are_current(tmp_path):
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "controller.proto").write_bytes((ROOT / "protos" / "controller.proto").read_bytes())
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--grpc_python_out=.", "--pyi_out=.",
         "protos/controller.proto"],
        cwd=tmp_path, check=True, capture_output=True, timeout=60,
    )
    stale = [name for name in GENERATED
             if (tmp_path / "protos" / name).read_bytes() != (ROOT / "protos" / name).read_bytes()]
    assert not stale, f"regenerate with `make protos`: {stale} differ from protos/controller.proto"


def test_package_name_is_versioned():
    text = (ROOT / "protos" / "controller.proto").read_text()
    assert "package fthsdp.v1;" in text
