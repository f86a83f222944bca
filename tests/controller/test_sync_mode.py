"""The job's sync mode (--sync-mode/--sync-every) on a real controller: REST, metrics, `fthsdp status`."""

import subprocess
import sys

import httpx


def test_the_sync_mode_is_shown_in_rest_metrics_and_status(controller_process):
    ctl = controller_process("--replicas", "2", "--job-id", "semi", "--sync-mode", "diloco", "--sync-every", "8")
    job = httpx.get(f"{ctl.http}/api/v1/job", timeout=10.0).json()
    assert (job["sync_mode"], job["sync_every_steps"]) == ("diloco", 8)
    metrics = httpx.get(f"{ctl.http}/metrics", timeout=10.0).text
    assert 'fthsdp_sync_mode{job_id="semi",mode="diloco"} 1.0' in metrics
    assert 'fthsdp_sync_every_steps{job_id="semi"} 8.0' in metrics
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", ctl.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "sync diloco every 8 inner steps" in out.stdout, out.stderr


def test_a_streaming_controller_shows_its_fragments_in_rest_metrics_and_status(controller_process):
    ctl = controller_process("--replicas", "2", "--job-id", "stream", "--sync-mode", "streaming_diloco",
                             "--sync-every", "8", "--sync-fragments", "2")
    job = httpx.get(f"{ctl.http}/api/v1/job", timeout=10.0).json()
    assert (job["sync_mode"], job["sync_every_steps"], job["sync_fragments"]) == ("streaming_diloco", 8, 2)
    metrics = httpx.get(f"{ctl.http}/metrics", timeout=10.0).text
    assert 'fthsdp_sync_fragments{job_id="stream"} 2.0' in metrics
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", ctl.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "sync streaming_diloco every 8 inner steps in 2 fragments" in out.stdout, out.stderr


def test_a_sync_controller_says_so_and_status_stays_as_it_was(controller_process):
    ctl = controller_process("--replicas", "2", "--job-id", "plain")
    job = httpx.get(f"{ctl.http}/api/v1/job", timeout=10.0).json()
    assert (job["sync_mode"], job["sync_every_steps"], job["sync_fragments"]) == ("sync", 1, 1)
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", ctl.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "inner steps" not in out.stdout


def test_the_controller_refuses_sync_every_without_a_semi_synchronous_mode():
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--replicas", "2", "--sync-every", "8",
                          "--grpc-port", "0", "--http-port", "0", "--insecure"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "sync_every_steps=8 needs sync_mode local_sgd, diloco or streaming_diloco" in \
        out.stderr
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--sync-mode", "diloko"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "invalid choice: 'diloko'" in out.stderr
