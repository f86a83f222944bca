"""Controller processes on one etcd, and simulated replica leaders that train through
failovers (real gRPC, FailoverChannel over every controller address)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from controller.launch import launch
from protos import controller_pb2 as pb
from protos.dial import FailoverChannel

JOB = "ha"


class ControllerProcess:
    """One of several controllers sharing an etcd, watched through its REST API."""

    def __init__(self, etcd_endpoint: str, *, replicas: int = 3, lease_ttl_s: float = 2.0, name: str = "c",
                 heartbeat_timeout_s: float = 10.0, extra: tuple[str, ...] = (), log_path: Path | None = None,
                 job_id: str = JOB, env: dict[str, str] | None = None) -> None:
        self.flags = ["--job-id", job_id, "--replicas", str(replicas), "--min-replicas", str(min(2, replicas)),
                      "--join-timeout-s", "2", "--heartbeat-timeout-s", str(heartbeat_timeout_s),
                      "--etcd", etcd_endpoint, "--lease-ttl-s", str(lease_ttl_s), *extra]
        self.name = name
        self.env = env  # with a job secret in it, the controller checks every caller's proof (else --insecure)
        self.log_path = log_path  # stderr (text log and JSON event lines), appended across restarts
        self.proc: subprocess.Popen | None = None
        self.grpc = self.http = ""

    def start(self) -> "ControllerProcess":
        # failover, not identity, is tested here, unless a job secret was given
        security = {"env": self.env, "insecure": False} if self.env else {"insecure": True}
        if self.log_path is None:
            started = launch(*self.flags, **security)
        else:
            with open(self.log_path, "a") as log:
                started = launch(*self.flags, stderr=log, **security)
        self.proc, self.grpc, self.http = started.proc, started.grpc, started.http
        return self

    def job(self) -> dict | None:
        try:
            return httpx.get(f"{self.http}/api/v1/job", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None

    def leads(self) -> bool:
        job = self.job()
        return bool(job and job.get("this_controller_leads"))

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@dataclass
class LeaderLog:
    """What one simulated leader saw: acked commits and quorum ids, in order."""

    replica_id: str
    #: the step of the last ReportStep sent (maybe applied, maybe not when stopped mid-call)
    sent_step: int = -1
    acked_steps: list[int] = field(default_factory=list)
    quorum_ids: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def train(addresses: list[str], replica_id: str, log: LeaderLog, stop: asyncio.Event, step_s: float = 0.02,
                job_id: str = JOB):
    """Quorum → (catch up to max_step) → commit → report, until stopped; every call fails
    over between controllers."""
    client = FailoverChannel(addresses, attempt_timeout_s=5.0, total_timeout_s=30.0)
    step = 0
    try:
        while not stop.is_set():
            q = await client.call("Quorum", pb.QuorumRequest(job_id=job_id, replica_id=replica_id, step=step,
                                                              world_size=1, incarnation=replica_id))
            log.quorum_ids.append(q.quorum_id)
            await asyncio.sleep(step_s)  # "training"
            log.sent_step = q.max_step
            await client.call("ReportStep", pb.ReportStepRequest(job_id=job_id, replica_id=replica_id,
                                                                  step=q.max_step, quorum_id=q.quorum_id))
            log.acked_steps.append(q.max_step)
            step = q.max_step + 1
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # recorded and asserted on by the test
        log.errors.append(repr(exc))
    finally:
        await client.close()
