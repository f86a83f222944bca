"""`fthsdp status` against a real controller process."""

import subprocess
import sys


from fthsdp.status import table


def test_status_prints_tables(controller_process):
    ctl = controller_process("--replicas", "2", "--job-id", "demo")
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", ctl.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "job demo" in out.stdout and "REPLICA" in out.stdout
    assert "round: no replica has joined this round" in out.stdout


def test_status_reports_unreachable_controller():
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", "http://127.0.0.1:9",
                          "--timeout-s", "2"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "cannot reach http://127.0.0.1:9" in out.stderr


def test_controller_refuses_bad_settings():
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--replicas", "2", "--min-replicas", "5",
                          "--grpc-port", "0", "--http-port", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "min_replicas must be between 1 and replicas (2), got 5" in out.stderr


def test_table_aligns_columns():
    assert table(["A", "BB"], [[1, None], ["long", 2]]).splitlines() == ["A     BB", "----  --", "1     -", "long  2"]
