"""Start a controller as a child process and learn where it serves.

For the demo, the benchmarks and the tests: `launch(flags...)` runs `python -m controller.main`
on OS-chosen ports and waits, bounded, for the one JSON "serving" line it prints.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("fthsdp.launch")

#: What a controller started with --insecure does not check (the warning names it).
UNCHECKED = ("registration proofs (any caller may claim any host id, a dead one included)",
             "agent secrets on heartbeats, orders and reports",
             "coordinator credentials on Quorum, QuorumStream, the quorum port, ReportStep, ReportFailure and "
             "ReportFinished")


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


#: How `launch` starts a controller: `subprocess.Popen`'s signature. A test harness that starts
#: hundreds of controllers sets another with `set_spawner` (tests/forked.py forks each from a
#: process that imported the controller once, which spares every start about 0.9 s of CPU).
Spawner = Callable[..., subprocess.Popen]
_spawner: Spawner = subprocess.Popen


def set_spawner(spawner: Spawner | None) -> None:
    """Start the controllers of later `launch` calls with `spawner` (None: `subprocess.Popen`)."""
    global _spawner
    _spawner = spawner or subprocess.Popen


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
           cwd: str | None = None, insecure: bool | None = None, spawner: Spawner | None = None) -> ControllerProcess:
    """Run `fthsdp controller --grpc-port 0 --http-port 0 FLAGS...` (later flags win).

    A helper of tests and benchmarks on one machine. The job secret comes from FLAGS
    (--job-secret-file) or the environment (FTHSDP_JOB_SECRET_FILE, FTHSDP_JOB_SECRET), as
    for the CLI. Without one:
      * `insecure=True` (or --insecure among FLAGS) asks for a controller that believes every
        caller: --insecure is passed, and one INFO line says so;
      * `insecure=None` (not said) does the same for the callers written before the CLI
        required a secret, with a WARNING line naming what such a controller does not check;
      * `insecure=False` refuses: ValueError naming the missing secret.
    With a secret, `insecure=True` is a contradiction (ValueError).
    `spawner` starts the process (default: the one `set_spawner` set, else `subprocess.Popen`)."""
    has_secret = _has_secret(flags, os.environ if env is None else env)
    asked = insecure is True or "--insecure" in flags
    if has_secret and insecure is True:
        raise ValueError("launch(insecure=True) with a job secret (--job-secret-file or FTHSDP_JOB_SECRET[_FILE]): "
                         "give one or the other")
    if not has_secret and not asked:
        if insecure is False:
            raise ValueError("launch(insecure=False) without a job secret: give --job-secret-file PATH, or "
                             "FTHSDP_JOB_SECRET_FILE / FTHSDP_JOB_SECRET in env")
        log.warning("launch: no job secret given, so the controller is started with --insecure and does not "
                    "check %s; pass insecure=True to say so, or a job secret to check them", "; ".join(UNCHECKED))
    elif not has_secret:
        log.info("launch: an --insecure controller (no job secret): callers are believed on their word")
    if not has_secret and "--insecure" not in flags:
        flags = (*flags, "--insecure")
    proc = (spawner or _spawner)(
        [sys.executable, "-m", "controller.main", "--grpc-port", "0", "--http-port", "0", *flags],
        stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
    try:
        info = read_json_line(proc, timeout_s, "the controller")
    except BaseException:
        proc.kill()
        proc.wait(10.0)
        raise
    return ControllerProcess(proc, info["grpc"], info["http"], info.get("candidate", ""), info.get("quorum", ""))


def _has_secret(flags: tuple[str, ...], env) -> bool:
    return "--job-secret-file" in flags or bool(env.get("FTHSDP_JOB_SECRET_FILE") or env.get("FTHSDP_JOB_SECRET"))
