"""The committed generated modules are exactly what protoc makes from the .proto files today."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# proto -> (protoc output flags, generated files), as the Makefile's `protos` target makes them
GENERATED = {
    "controller.proto": (["--python_out=.", "--grpc_python_out=.", "--pyi_out=."],
                         ("controller_pb2.py", "controller_pb2_grpc.py", "controller_pb2.pyi")),
    "replica.proto": (["--python_out=.", "--pyi_out=."], ("replica_pb2.py", "replica_pb2.pyi")),
}


@pytest.mark.parametrize("proto", sorted(GENERATED))
def test_generated_modules_are_current(tmp_path, proto):
    flags, outputs = GENERATED[proto]
    (tmp_path / "protos").mkdir()
    for name in GENERATED:  # replica.proto imports controller.proto
        (tmp_path / "protos" / name).write_bytes((ROOT / "protos" / name).read_bytes())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", *flags, f"protos/{proto}"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    stale = [name for name in outputs
             if (tmp_path / "protos" / name).read_bytes() != (ROOT / "protos" / name).read_bytes()]
    assert not stale, f"regenerate with `make protos`: {stale} differ from protos/{proto}"


@pytest.mark.parametrize("proto", sorted(GENERATED))
def test_package_name_is_versioned(proto):
    assert "package fthsdp.v1;" in (ROOT / "protos" / proto).read_text()
