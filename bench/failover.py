"""Controller failover on a real etcd: how long it takes, and whether it hurts anyone.

    python -m bench.failover --json [--trials 5] [--lease-ttl-s 2]

Two controllers share one etcd, each on a fixed port (a killed one comes back on its own
port, as a pod behind a Service would). Two real agent processes (an active host whose
trainer is `sleep`, and a spare) heartbeat through every takeover, and a simulated replica
leader trains r0 without pause, failing over like every client (protos.dial). The heartbeat
timeout is the lease TTL + 1 s: tight enough that a takeover which left clients waiting
would get them declared dead. Each trial SIGKILLs the active controller; `failover_s` is the
time until the leader's next quorum is answered. The trial then waits out the takeover's
danger window (the silence grace, then the heartbeat timeout) before the next kill.

Everything runs as the docs start it, with a job secret made for the run (`--job-secret-file`
for the controllers and the agents); the simulated leader shows the trainer token h1's agent
would hand it.

Prints one JSON line (FIELDS): failover_s (median) and the trials, spurious_deaths (replica
deaths plus host deaths the controllers recorded; nothing but controllers was harmed, so every
one is spurious: must be 0), swaps, lease_ttl_s, heartbeat_timeout_s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import tempfile
from pathlib import Path

import httpx

from bench.common import free_port, secret_file
from controller.launch import ControllerProcess, launch
from controller.settings import ControllerSettings
from protos import controller_pb2 as pb
from protos import credentials, job_secret
from protos.dial import FailoverChannel

JOB = "failover"
#: the fields of the JSON line (`python -m bench.failover --json`) and their types
FIELDS = {"failover_s": float, "trials": list[float], "spurious_deaths": int, "swaps": int, "lease_ttl_s": float,
          "heartbeat_timeout_s": float}


class Leader:
    """A replica leader without a model: quorum, commit, report, as fast as answers come."""

    def __init__(self, addresses: list[str], job: str, credential: str) -> None:
        self.client = FailoverChannel(addresses, attempt_timeout_s=2.0, total_timeout_s=120.0)
        self.job, self.credential = job, credential
        self.answered: list[float] = []  # perf_counter of every quorum answer
        self.error: BaseException | None = None

    async def run(self, stop: asyncio.Event) -> None:
        step = 0
        try:
            while not stop.is_set():
                # r0's rank 0 is on h1 (the agent below): its leader names that host
                q = await self.client.call("Quorum", pb.QuorumRequest(
                    job_id=self.job, replica_id="r0", step=step, world_size=1, incarnation="bench", host_id="h1",
                    credential=self.credential))
                self.answered.append(time.perf_counter())
                await self.client.call("ReportStep", pb.ReportStepRequest(
                    job_id=self.job, replica_id="r0", step=q.max_step, quorum_id=q.quorum_id, host_id="h1",
                    credential=self.credential))
                step = q.max_step + 1
                await asyncio.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - reported by the trial that waits on it
            self.error = exc
        finally:
            await self.client.close()

    async def next_answer_after(self, t: float, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while not any(a > t for a in self.answered):
            if self.error is not None:
                raise RuntimeError(f"the simulated leader failed: {self.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no quorum was answered within {timeout_s}s of the kill")
            await asyncio.sleep(0.01)
        return next(a for a in self.answered if a > t)


def start_agent(addresses: str, host_id: str, secret: Path, *extra: str) -> subprocess.Popen:
    """A real agent process (its trainer is `sleep`); stopped by PID in `run`."""
    return subprocess.Popen([sys.executable, "-m", "fthsdp.cli", "agent", "--controller", addresses,
                             "--host-id", host_id, "--heartbeat-interval-s", "0.5", "--job-secret-file", str(secret),
                             *extra, "--", "sleep", "600"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def leads(controller: ControllerProcess) -> bool:
    try:
        job = httpx.get(f"{controller.http}/api/v1/job", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return bool(job.get("this_controller_leads"))


HOSTS = ("h1", "spare0")


def hosts_registered(controller) -> bool:
    hosts = httpx.get(f"{controller.http}/api/v1/hosts", timeout=5).json()
    return {h["host_id"] for h in hosts} >= set(HOSTS)


def damage(controller) -> tuple[int, int]:
    """(deaths, swaps) as the leading controller recorded them."""
    if not hosts_registered(controller):
        raise RuntimeError(f"the agents {HOSTS} are not registered: the measurement would mean nothing")
    job = httpx.get(f"{controller.http}/api/v1/job", timeout=5).json()
    events = httpx.get(f"{controller.http}/api/v1/events?limit=100000", timeout=5).json()
    return sum(job["deaths"].values()) + sum(e["kind"] == "host_death" for e in events), job["swaps"]


async def leader_of(controllers, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        for c in controllers:
            if await asyncio.to_thread(leads, c):
                return c
        if time.monotonic() > deadline:
            raise RuntimeError(f"no controller became leader within {timeout_s}s")
        await asyncio.sleep(0.05)


async def run(trials: int, lease_ttl_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-failover-") as tmp:
        return await _run(trials, lease_ttl_s, secret_file(tmp))


async def _run(trials: int, lease_ttl_s: float, secret: Path) -> dict:
    from tests.etcd_server import EtcdServer

    heartbeat_timeout_s = lease_ttl_s + 1.0
    settings = ControllerSettings(heartbeat_timeout_s=heartbeat_timeout_s).validate()
    window_s = settings.takeover_grace_s + heartbeat_timeout_s + 1.0
    ports = [free_port() for _ in range(2)]
    addresses = [f"127.0.0.1:{p}" for p in ports]

    def controller(i: int) -> ControllerProcess:
        return launch("--job-id", JOB, "--replicas", "1", "--min-replicas", "1", "--join-timeout-s", "2",
                      "--heartbeat-timeout-s", str(heartbeat_timeout_s), "--etcd", etcd.endpoint,
                      "--lease-ttl-s", str(lease_ttl_s), "--grpc-port", str(ports[i]), "--job-secret-file", str(secret))

    etcd = EtcdServer.start_new()
    controllers, agents, times = [], [], []
    stop = asyncio.Event()
    token = credentials.trainer_token(job_secret.read_file(secret), "h1")  # what h1's agent hands its trainer
    leader = Leader(addresses, JOB, credentials.host_credential(token))
    task = None
    try:
        controllers = [await asyncio.to_thread(controller, i) for i in range(2)]
        await leader_of(controllers)
        agents = [start_agent(",".join(addresses), "h1", secret, "--replica-id", "r0", "--ranks", "0",
                              "--world-size", "1"),
                  start_agent(",".join(addresses), "spare0", secret, "--spare")]
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(hosts_registered, await leader_of(controllers)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agents {HOSTS} did not register within 60 s")
            await asyncio.sleep(0.1)
        # h1 holds r0's rank 0 from its registration on: only then is its token a leader's credential
        task = asyncio.create_task(leader.run(stop))
        await leader.next_answer_after(time.perf_counter(), 60)
        for _ in range(trials):
            active = await leader_of(controllers)
            i = controllers.index(active)
            killed = time.perf_counter()
            os.kill(active.pid, signal.SIGKILL)
            times.append(await leader.next_answer_after(killed, 60) - killed)
            await asyncio.to_thread(active.proc.wait, 10)
            controllers[i] = await asyncio.to_thread(controller, i)  # back on its port, as a standby
            # Wait out the danger window: a client that had not found the new leader dies in it.
            await asyncio.sleep(max(window_s - (time.perf_counter() - killed), 0))
        deaths, swaps = await asyncio.to_thread(damage, await leader_of(controllers))
    finally:
        stop.set()
        if task is not None:
            await asyncio.wait_for(task, 30)
        for a in agents:
            a.terminate()
        for a in agents:
            try:
                a.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(a.pid, signal.SIGKILL)
                a.wait(5)
        for c in controllers:
            c.stop()
        etcd.close()
    return {"failover_s": round(statistics.median(times), 3), "trials": [round(t, 3) for t in times],
            "spurious_deaths": deaths, "swaps": swaps, "lease_ttl_s": lease_ttl_s,
            "heartbeat_timeout_s": heartbeat_timeout_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--lease-ttl-s", type=float, default=2.0)
    p.add_argument("--json", action="store_true", help="print one JSON line (the default output)")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error(f"--trials must be at least 1, got {args.trials}")
    if args.lease_ttl_s < 1:
        p.error(f"--lease-ttl-s must be at least 1 (etcd leases are whole seconds), got {args.lease_ttl_s}")
    print(json.dumps(asyncio.run(run(args.trials, args.lease_ttl_s))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
