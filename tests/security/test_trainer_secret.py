"""The job secret's way to the trainer ports, with real processes: a trainer without one refuses to
open them (and says how to give one), insecure mode is explicit and says so, and the agent hands
the secret to its trainers in their environment only -- never in argv, its log, or REST."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from controller.launch import read_json_line
from protos import job_secret
from tests import forked
from tests.agent.helpers import ready_files, trainer_command
from tests.runtime.cluster import REPO, start_controller
from tests.waiting import wait_for

NO_SECRET = {k: v for k, v in os.environ.items() if k not in (
    job_secret.ENV_JOB_SECRET, job_secret.ENV_JOB_SECRET_FILE, job_secret.ENV_INSECURE_TRAINER_PORTS)}


def worker(controller: str, workdir, env: dict) -> subprocess.CompletedProcess:
    """One single-rank replica of tests/runtime/train_worker.py that trains one step, if it may
    (forked from the pre-imported server, tests/forked.py, with exactly `env`)."""
    cfg = {"replica_id": "0", "rank": 0, "world_size": 1, "incarnation": 0, "controller": controller,
           "coordinator_address": "", "gloo_port": 0, "steps": 1, "max_steps": 1, "replicas": 1, "faults": [],
           "record": str(workdir / "record.jsonl")}
    log = workdir / f"worker-{len(list(workdir.glob('worker-*.log')))}.log"
    proc = forked.start("tests.runtime.train_worker", [json.dumps(cfg)], log=log, env=env, cwd=REPO)
    try:
        proc.stdin.write("go\n")
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.close()
    return subprocess.CompletedProcess(proc.args, code, "", log.read_text())


def test_a_trainer_without_a_secret_refuses_to_open_its_ports_and_one_in_insecure_mode_says_so(tmp_path):
    ctl = start_controller(tmp_path / "controller.log", replicas=1, join_timeout_s=0.2, heartbeat_timeout_s=10.0)
    try:
        refused = worker(ctl.grpc, tmp_path, NO_SECRET)
        assert refused.returncode != 0
        for hint in ("The trainer ports need the job secret", "FTHSDP_JOB_SECRET_FILE=PATH", "FTHSDP_JOB_SECRET=HEX",
                     "FTHSDP_INSECURE_TRAINER_PORTS=1"):
            assert hint in refused.stderr, refused.stderr[-2000:]
        assert not (tmp_path / "record.jsonl").exists() or "started" not in (tmp_path / "record.jsonl").read_text()
        insecure = worker(ctl.grpc, tmp_path, {**NO_SECRET, job_secret.ENV_INSECURE_TRAINER_PORTS: "1"})
        assert insecure.returncode == 0, insecure.stderr[-2000:]
        for port in ("coordinator accepts ranks WITHOUT authentication", "accepts peers WITHOUT authentication",
                     "serves WITHOUT authentication"):
            assert port in insecure.stderr, port
        assert '"event": "commit"' in (tmp_path / "record.jsonl").read_text()
    finally:
        ctl.stop()


async def test_the_agent_hands_its_trainers_the_secret_in_their_environment_only(tmp_path):
    secret, decoy = job_secret.generate(), job_secret.generate()
    (tmp_path / "job-secret").write_text(secret + "\n")
    (tmp_path / "decoy").write_text(decoy)
    ready = tmp_path / "ready"
    ready.mkdir()
    ctl = start_controller(tmp_path / "controller.log", replicas=1, join_timeout_s=0.2, heartbeat_timeout_s=10.0)
    log = open(tmp_path / "agent.log", "w")
    agent = subprocess.Popen(  # the flag wins over the file its own environment names
        [sys.executable, "-m", "fthsdp.cli", "agent", "--controller", ctl.grpc, "--host-id", "h1", "--replica-id", "r0",
         "--ranks", "0", "--world-size", "1", "--job-secret-file", str(tmp_path / "job-secret"), "--log-level", "DEBUG",
         "--", *trainer_command(str(ready))], cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True,
        env={**NO_SECRET, job_secret.ENV_JOB_SECRET_FILE: str(tmp_path / "decoy")})
    try:
        read_json_line(agent, 60.0, "the agent's registered line")
        (trainer,) = await wait_for(lambda: ready_files(str(ready)), 30.0, "the trainer's ready file")
        assert trainer["env"][job_secret.ENV_JOB_SECRET] == secret
        assert job_secret.ENV_JOB_SECRET_FILE not in trainer["env"]
        assert not any(secret in arg for arg in trainer["argv"])
        with httpx.Client(base_url=ctl.http, timeout=10) as http:
            views = "".join(http.get(p).text for p in ("/api/v1/hosts", "/api/v1/replicas", "/api/v1/events"))
        assert "h1" in views and secret not in views and decoy not in views
    finally:
        agent.terminate()
        agent.wait(30)
        log.close()
        ctl.stop()
    logged = (tmp_path / "agent.log").read_text()
    assert "started pid" in logged and secret not in logged and decoy not in logged


def test_an_agent_whose_secret_is_too_short_stops_at_once_without_showing_it(tmp_path):
    (tmp_path / "short").write_text("ab" * 10)
    proc = subprocess.run([sys.executable, "-m", "fthsdp.cli", "agent", "--controller", "127.0.0.1:1", "--host-id",
                           "h1", "--job-secret-file", str(tmp_path / "short"), "--", "true"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=NO_SECRET)
    assert proc.returncode == 2
    assert f"the job secret from file {tmp_path / 'short'} is 10 bytes; it must be 32" in proc.stderr
    assert "ab" * 10 not in proc.stderr
