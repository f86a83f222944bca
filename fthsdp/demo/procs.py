"""Processes of the demo: the controller and agent CLIs, trainers, and how they are killed.

Only processes this demo started are signalled, by pid. "Killing a host" SIGKILLs an agent
and every process under it (its trainers), read from /proc before the agent dies. Agents,
trainers and the controller get the run's job secret in their environment (never on a command
line).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from controller.launch import ControllerProcess, launch, read_json_line  # noqa: F401 - used by run.py
from protos import job_secret

PYTHON = sys.executable
_FTHSDP_BIN = Path(PYTHON).with_name("fthsdp")
FTHSDP = [str(_FTHSDP_BIN)] if _FTHSDP_BIN.exists() else [
    PYTHON, "-c", "import sys; from fthsdp.cli import main; sys.exit(main())"]
TRAINER = [PYTHON, "-m", "fthsdp.demo.trainer"]


def start_controller(log: Path, *, job_id: str, replicas: int, join_timeout_s: float,
                     heartbeat_timeout_s: float, lr_policy: str, settings: Path | None = None,
                     secret: str, sync_flags: tuple[str, ...] = ()) -> ControllerProcess:
    """The controller, holding the run's job secret (agents and leaders prove it), running the
    job in the mode `sync_flags` name (RunSettings.controller_flags: the trainers must agree)."""
    extra = (("--settings", str(settings)) if settings else ()) + tuple(sync_flags)
    with open(log, "w") as err:
        return launch("--job-id", job_id, "--replicas", str(replicas), "--min-replicas", "1",
                      "--join-timeout-s", str(join_timeout_s), "--heartbeat-timeout-s", str(heartbeat_timeout_s),
                      "--lr-policy", lr_policy, *extra, stderr=err, env=environment(secret))


def environment(secret: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with `secret` as the job secret (a secret file named in the
    caller's environment would win over it, so it is left out) and `extra`."""
    env = {k: v for k, v in os.environ.items() if k != job_secret.ENV_JOB_SECRET_FILE}
    return {**env, job_secret.ENV_JOB_SECRET: secret, **(extra or {})}


#: The demo agents' timeouts (AgentSettings field names; each is the flag of the same name).
AGENT_TIMEOUTS = {"heartbeat_interval_s": 0.5, "stop_grace_s": 2.0, "telemetry_interval_s": 0.5}


def start_agent(log: Path, *, controller: str, host_id: str, job_id: str, command: list[str], secret: str,
                replica_id: str = "", ranks: int = 1, spare: bool = False, standby: bool = False,
                heartbeat_interval_s: float = AGENT_TIMEOUTS["heartbeat_interval_s"],
                extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> subprocess.Popen:
    """`extra`: more agent flags (e.g. --standby-restart-budget); `env`: more environment
    variables (its trainers inherit them too)."""
    args = FTHSDP + ["agent", "--controller", controller, "--host-id", host_id, "--job-id", job_id,
                     "--heartbeat-interval-s", str(heartbeat_interval_s),
                     "--stop-grace-s", str(AGENT_TIMEOUTS["stop_grace_s"]), "--slots", str(ranks),
                     "--telemetry-interval-s", str(AGENT_TIMEOUTS["telemetry_interval_s"]), *extra]
    if spare:
        args += ["--spare"] + (["--standby"] if standby else [])
    else:
        args += ["--replica-id", replica_id, "--ranks", ",".join(map(str, range(ranks))),
                 "--world-size", str(ranks)]
    with open(log, "w") as err:
        return subprocess.Popen(args + ["--"] + command, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, text=True, env=environment(secret, env))


def start_trainer(log: Path, config: Path, env: dict[str, str], secret: str) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen(TRAINER + [str(config)], stdout=subprocess.DEVNULL, stderr=err,
                                stdin=subprocess.DEVNULL, env=environment(secret, env))


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children first-level first), from /proc."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            for child in map(int, children):
                out.append(child)
                todo.append(child)
    return out


def kill_host(agent: subprocess.Popen) -> list[int]:
    """SIGKILL an agent and everything it started, as if the host lost power."""
    under = descendants(agent.pid)
    agent.kill()
    for pid in under:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait()
    return under


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
