"""What the trainer-port attacks share: the attacked port in its own process, strangers on raw
sockets, and the counts that must stay bounded (threads and resident memory, from /proc)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from bench.procstat import rss_mib
from controller.launch import read_json_line
from fthsdp.step import messages as msg
from protos import job_secret
from tests import trainer_secret

REPO = Path(__file__).resolve().parents[2]
#: a secret of another job: what a stranger who guessed the protocol but not the secret holds
STRANGER = job_secret.parse(job_secret.generate(), "a stranger")


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


class PortProcess:
    """tests/security/port_server.py: one port, the job secret in its environment."""

    def __init__(self, kind: str, log: Path, **config) -> None:
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.security.port_server", kind, json.dumps(config)],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env={**os.environ, **trainer_secret.ENV})
        info = read_json_line(self.proc, 60.0, f"the {kind} port (log {log})")
        self.address, self.pid = info["address"], info["pid"]

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host, int(port)

    def ask(self, command: str, timeout_s: float = 30.0) -> dict:
        self.send(command)
        return self.reply(timeout_s, command)

    def send(self, command: str) -> None:
        """Send a command without waiting for its answer (`reply` reads it)."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout_s: float = 30.0, what: str = "a command") -> dict:
        return read_json_line(self.proc, timeout_s, f"the answer to {what}")

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def threads(self) -> int:
        return threads(self.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def dial(host_port: tuple[str, int], timeout_s: float = 20.0) -> socket.socket:
    """A raw connection; every read on it is bounded by timeout_s."""
    return socket.create_connection(host_port, timeout=timeout_s)


def coordinator_frames(sock: socket.socket, limit: int = 10) -> list[tuple[str, object]]:
    """Every frame the coordinator sends on `sock` until it closes it (at most `limit`)."""
    reader, out = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES), []
    while len(out) < limit:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += [msg.decode_coordinator_frame(b) for b in reader.feed(chunk)]
    return out


def next_coordinator_frame(sock: socket.socket, reader: msg.FrameReader) -> tuple[str, object]:
    while True:
        chunk = sock.recv(1 << 16)
        assert chunk, "the coordinator closed the connection"
        bodies = reader.feed(chunk)
        if bodies:
            return msg.decode_coordinator_frame(bodies[0])


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other side closed `sock` (reads what is left; bounded by its timeout)."""
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    return True
