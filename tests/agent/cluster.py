"""A real controller and real agents as subprocesses on loopback, for integration tests and
bench/swap. Every process is started here and stopped here, by PID; trainers die with their
agent (PR_SET_PDEATHSIG) and any left over are killed by the PIDs in their ready files."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from controller.launch import launch
from protos import job_secret
from tests.agent.helpers import alive, ready_files, trainer_command, wait_for

CLI = (sys.executable, "-m", "fthsdp.cli")


class Waitable:
    """asyncio's Process interface (the part the tests use) over a `subprocess.Popen`-like
    process, as `controller.launch` starts it (in tests: forked, tests/forked.py)."""

    def __init__(self, proc) -> None:
        self._proc = proc
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def kill(self) -> None:
        self._proc.kill()

    async def wait(self) -> int:
        """Its exit code, once it exited (each look at it bounded; the caller bounds the whole)."""
        while (code := self._proc.poll()) is None:
            try:
                await asyncio.to_thread(self._proc.wait, 0.2)
            except subprocess.TimeoutExpired:
                pass
        return code


class Proc:
    def __init__(self, name: str, proc: asyncio.subprocess.Process | Waitable, out: Path, err: Path):
        self.name, self.proc, self.out, self.err = name, proc, out, err

    @property
    def pid(self) -> int:
        return self.proc.pid

    def first_line(self) -> dict | None:
        text = self.out.read_text() if self.out.exists() else ""
        return json.loads(text.splitlines()[0]) if "\n" in text else None

    def log(self) -> str:
        return self.err.read_text() if self.err.exists() else ""


class Cluster:
    def __init__(self, root: Path, heartbeat_timeout_s: float = 3.0) -> None:
        self.root = root
        self.ready_dir = root / "ready"
        self.ready_dir.mkdir(exist_ok=True)
        self.token_file = root / "admin-token"
        self.token_file.write_text("s3cret\n")
        self.heartbeat_timeout_s = heartbeat_timeout_s
        #: the job secret the controller and every agent hold (in their environment), so that
        #: agents prove it at registration and their trainers show their host's token
        self.secret = job_secret.generate()
        self.env = {**{k: v for k, v in os.environ.items() if k != job_secret.ENV_JOB_SECRET_FILE},
                    job_secret.ENV_JOB_SECRET: self.secret}
        self.procs: list[Proc] = []
        self.grpc = self.http = ""

    async def _spawn(self, name: str, *args: str) -> Proc:
        out, err = self.root / f"{name}.out", self.root / f"{name}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = await asyncio.create_subprocess_exec(*args, stdout=fo, stderr=fe,
                                                        stdin=asyncio.subprocess.DEVNULL, env=self.env)
        self.procs.append(Proc(name, proc, out, err))
        return self.procs[-1]

    async def start_controller(self, replicas: int = 3, restart_budget: int = 0, *flags: str) -> Proc:
        """`restart_budget`: replica restarts a host's trainer deaths may cause before the host
        is replaced (0: the first death swaps it)."""
        out, err = self.root / "controller.out", self.root / "controller.err"
        with open(err, "wb") as fe:
            ctl = await asyncio.to_thread(
                launch, "--replicas", str(replicas), "--min-replicas", "1", "--join-timeout-s", "1.0",
                "--heartbeat-timeout-s", str(self.heartbeat_timeout_s), "--restart-budget", str(restart_budget),
                "--admin-token-file", str(self.token_file), *flags, stderr=fe, timeout_s=30.0, env=self.env)
        # its serving line, read by `launch`, where `first_line` reads it
        out.write_text(json.dumps({"grpc": ctl.grpc, "http": ctl.http, "quorum": ctl.quorum}) + "\n")
        self.grpc, self.http = ctl.grpc, ctl.http
        self.procs.append(Proc("controller", Waitable(ctl.proc), out, err))
        return self.procs[-1]

    async def start_agent(self, host_id: str, *, replica: str = "", rank: int = 0,
                          world_size: int = 1, spare: bool = False, standby: bool = False,
                          labels: str = "", command: tuple[str, ...] = (),
                          wait: bool = True, extra: tuple[str, ...] = (), name: str = "",
                          ranks: str = "") -> Proc:
        """An agent for `host_id`: with `replica` it claims that assignment, with `spare` it is
        a spare, with neither it is available (the controller's layout decides). `name` names
        its output files when the host had an agent before; `ranks` ("0,1") runs several of the
        replica's ranks here instead of `rank`."""
        args = [*CLI, "agent", "--controller", self.grpc, "--host-id", host_id,
                "--heartbeat-interval-s", "0.3", "--stop-grace-s", "2", "--insecure", *extra]
        if spare:
            args.append("--spare")
        elif replica:
            args += ["--replica-id", replica, "--ranks", ranks or str(rank), "--world-size",
                     str(world_size)]
        if standby:
            args.append("--standby")
        if labels:
            args += ["--labels", labels]
        p = await self._spawn(name or host_id, *args, "--",
                              *(command or trainer_command(self.ready_dir, "--join")))
        if wait:
            await wait_for(p.first_line, 30, f"agent {host_id} registered")
        return p

    async def get(self, path: str):
        async with httpx.AsyncClient(base_url=self.http, timeout=10) as client:
            response = await client.get(path)
            response.raise_for_status()
            return response.json()

    async def post(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=self.http, timeout=10) as client:
            return await client.post(path, headers=headers)

    async def host(self, host_id: str) -> dict:
        return {h["host_id"]: h for h in await self.get("/api/v1/hosts")}[host_id]

    async def replica(self, replica_id: str) -> dict | None:
        return {r["replica_id"]: r for r in await self.get("/api/v1/replicas")}.get(replica_id)

    async def events(self, kind: str | None = None) -> list[dict]:
        events = await self.get("/api/v1/events?limit=1000")
        return [e for e in events if kind is None or e.get("kind") == kind]

    def trainers(self, replica: str = "*", rank: str = "*") -> list[dict]:
        return ready_files(self.ready_dir, replica, rank)

    async def close(self) -> None:
        """SIGTERM everything we started (agents first), then SIGKILL what is left."""
        for p in reversed(self.procs):
            if p.proc.returncode is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                await asyncio.wait_for(p.proc.wait(), 10)
            except asyncio.TimeoutError:
                p.proc.kill()
                await p.proc.wait()
        for t in self.trainers():
            for pid in (t["pid"], t.get("child_pid")):
                if pid and alive(pid):
                    os.kill(pid, signal.SIGKILL)
