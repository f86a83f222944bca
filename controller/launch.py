"""Start a controller as a child process and learn where it serves.

For the demo, the benchmarks and the tests: `launch(flags...)` runs `python -m controller.main`
on OS-chosen ports and waits, bounded, for the one JSON "serving" line it prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass


def read_json_line(proc: subprocess.Popen, timeout_s: float, what: str) -> dict:
    """The first line `proc` prints, parsed as JSON; RuntimeError naming `what` if none comes
    within `timeout_s` (the read runs on a helper thread, so a silent child cannot hang us)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0].strip():
        raise RuntimeError(f"{what} printed nothing within {timeout_s:g}s (exit code {proc.poll()})")
    return json.loads(box[0])


@dataclass
class ControllerProcess:
    proc: subprocess.Popen
    grpc: str
    http: str
    candidate: str = ""
    #: the quorum port's address ("" when it has none)
    quorum: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace_s)
        return self.proc.returncode


def launch(*flags: str, stderr=subprocess.DEVNULL, timeout_s: float = 60.0, env: dict | None = None,
           cwd: str | None = None) -> ControllerProcess:
    """Run `fthsdp controller --grpc-port 0 --http-port 0 FLAGS...` (later flags win).

    A helper of tests and benchmarks on one machine: when neither FLAGS (--job-secret-file,
    --insecure) nor the environment (FTHSDP_JOB_SECRET_FILE, FTHSDP_JOB_SECRET) gives a job
    secret, it adds --insecure (the CLI itself refuses to start without one). The demo, the
    benchmarks that measure with authentication and the identity tests pass a secret."""
    if not _has_secret(flags, os.environ if env is None else env):
        flags = (*flags, "--insecure")
    proc = subprocess.Popen([sys.executable, "-m", "controller.main", "--grpc-port", "0", "--http-port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True, env=env,
                            cwd=cwd)
    try:
        info = read_json_line(proc, timeout_s, "the controller")
    except BaseException:
        proc.kill()
        proc.wait(10.0)
        raise
    return ControllerProcess(proc, info["grpc"], info["http"], info.get("candidate", ""), info.get("quorum", ""))


def _has_secret(flags: tuple[str, ...], env) -> bool:
    return ("--job-secret-file" in flags or "--insecure" in flags
            or bool(env.get("FTHSDP_JOB_SECRET_FILE") or env.get("FTHSDP_JOB_SECRET")))
