"""torchft's quorum, driven the way bench.quorum drives ours: the yardstick, not our code.

Uses only torchft's public coordination API (`torchft.coordination`, torchft 0.2) and its
`torchft_lighthouse` binary:

- direct: the lighthouse binary as its own process (`--min_replicas N`, so a round closes
  when all N joined, as ours does), and N `LighthouseClient.quorum` calls from N threads of
  this process: one request to the central service, one answer, per replica and step.
- manager: what torchft's trainers do: each replica's `ManagerServer` (in this process, as
  in a trainer's rank 0; it heartbeats to its own lighthouse every 100 ms) asked by
  `ManagerClient._quorum` from N threads; each manager asks the lighthouse in turn.

Both lighthouses run with RUST_LOG=warn (unless set otherwise): at its default level the
lighthouse logs several lines per request, which would slow it down for nothing. The two
paths use two lighthouses, because the managers' heartbeats would make the direct path's
lighthouse wait for them as stragglers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from bench.common import free_port

os.environ.setdefault("RUST_LOG", "warn")  # before torchft's Rust logger starts in this process

CONNECT_TIMEOUT = timedelta(seconds=15)
ROUND_TIMEOUT = timedelta(seconds=30)
MANAGER_HEARTBEAT = timedelta(milliseconds=100)
LIGHTHOUSE_BINARY = "torchft_lighthouse"


def _binary() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), LIGHTHOUSE_BINARY)
    return here if os.path.exists(here) else shutil.which(LIGHTHOUSE_BINARY)


def missing() -> str:
    """Why the comparison cannot run here ("" when it can)."""
    try:
        import torchft.coordination  # noqa: F401
    except ImportError as exc:
        return f"torchft is not installed ({exc}); pip install 'fthsdp[bench]'"
    if _binary() is None:
        return f"torchft is installed but its {LIGHTHOUSE_BINARY} binary is not on PATH"
    return ""


class Lighthouse:
    """The lighthouse binary on a port of `host` (picked free just before it starts; `host` is
    loopback unless the caller's thread is in a network namespace that has another address)."""

    def __init__(self, replicas: int, attempts: int = 3, listen_timeout_s: float = 30.0,
                 host: str = "127.0.0.1") -> None:
        self.host = host
        # The port is free when picked, but another process may take it before the binary
        # binds (a shared machine): then the binary exits, and we try a new port.
        for _ in range(attempts):
            port = free_port()
            self.address = f"http://{host}:{port}"
            self.proc = subprocess.Popen(
                [_binary(), "--bind", f"{host}:{port}", "--min_replicas", str(replicas), "--join_timeout_ms",
                 "60000", "--heartbeat_timeout_ms", "600000"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._listening(port, time.monotonic() + listen_timeout_s):
                return
            self.stop()
        raise RuntimeError(f"torchft's {LIGHTHOUSE_BINARY} did not listen in {attempts} attempts "
                           f"(last exit code {self.proc.returncode})")

    def _listening(self, port: int, deadline: float) -> bool:
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection((self.host, port), timeout=1.0).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class TorchftReplicas:
    def __init__(self, replicas: int) -> None:
        from torchft.coordination import LighthouseClient, ManagerClient, ManagerServer

        self.replicas = replicas
        self.pool = ThreadPoolExecutor(replicas)
        self.lighthouses = [Lighthouse(replicas), Lighthouse(replicas)]
        self.managers = []
        try:
            direct, behind = self.lighthouses
            # Each client connects in its constructor, bounded by CONNECT_TIMEOUT.
            self.direct = [LighthouseClient(direct.address, CONNECT_TIMEOUT) for _ in range(replicas)]
            self.managers = [ManagerServer(
                replica_id=f"m{i:03d}", lighthouse_addr=behind.address, hostname="127.0.0.1", bind="127.0.0.1:0",
                store_addr=f"127.0.0.1:{29600 + i}", world_size=1, heartbeat_interval=MANAGER_HEARTBEAT,
                connect_timeout=CONNECT_TIMEOUT, quorum_retries=0) for i in range(replicas)]
            self.manager_clients = [ManagerClient(m.address(), CONNECT_TIMEOUT) for m in self.managers]
        except BaseException:
            self.close()
            raise
        self.direct_step = self.manager_step = 0

    def _direct(self, i: int):
        return self.direct[i].quorum(replica_id=f"d{i:03d}", timeout=ROUND_TIMEOUT, address=f"10.0.{i}.1:29500",
                                     store_address=f"10.0.{i}.1:29600", step=self.direct_step, world_size=1,
                                     shrink_only=False)

    def _manager(self, i: int):
        return self.manager_clients[i]._quorum(group_rank=0, step=self.manager_step, checkpoint_metadata="",
                                               shrink_only=False, timeout=ROUND_TIMEOUT, commit_failures=0,
                                               init_sync=True)

    def lighthouse_round(self) -> float:
        start = time.perf_counter()
        replies = list(self.pool.map(self._direct, range(self.replicas)))
        elapsed = (time.perf_counter() - start) * 1000
        ids = {q.quorum_id for q in replies}
        if len(ids) != 1 or any(len(q.participants) != self.replicas for q in replies):
            raise RuntimeError(f"torchft lighthouse round {self.direct_step}: quorum ids {ids}, participants "
                               f"{sorted({len(q.participants) for q in replies})}")
        self.direct_step += 1
        return elapsed

    def manager_round(self) -> float:
        start = time.perf_counter()
        replies = list(self.pool.map(self._manager, range(self.replicas)))
        elapsed = (time.perf_counter() - start) * 1000
        ids = {q.quorum_id for q in replies}
        if len(ids) != 1 or any(len(q.replica_ids) != self.replicas or q.max_step != self.manager_step
                                for q in replies):
            raise RuntimeError(f"torchft manager round {self.manager_step}: quorum ids {ids}")
        self.manager_step += 1
        return elapsed

    def close(self) -> None:
        for m in self.managers:
            m.shutdown()
        self.pool.shutdown(wait=False)
        for lighthouse in self.lighthouses:
            lighthouse.stop()
