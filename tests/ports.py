"""Ports for test processes that listen later: picked where nothing takes them meanwhile.

A port found free now and bound by a process a second later can be taken in between: by a
port-0 bind or an outgoing connection (both draw from the kernel's ephemeral range, 32768-60999
on Linux by default) or by the other xdist worker's tests. So these ports come from below the
ephemeral range, from a block of their own per xdist worker, handed out in turn (a port comes
round again only after its block has), and each is checked free when it is handed out.
"""

from __future__ import annotations

import os
import socket

BASE = 10000
#: per xdist worker: gw0 10000-12499, gw1 12500-14999, ... (4 blocks), all below the ports agents
#: pick for themselves (agent/ports.py: from 20000 up) and the demo's window (protos/local_ports.py)
BLOCK = 2500
_next: dict[str, int] = {}


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    return BASE + (n % 4) * BLOCK


def free_port() -> int:
    """A loopback TCP port nobody listens on, from this worker's block."""
    start = _block()
    offset = _next.get("offset", os.getpid() % BLOCK)
    for _ in range(BLOCK):
        port = start + offset
        offset = (offset + 1) % BLOCK
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next["offset"] = offset
        return port
    raise RuntimeError(f"no free port in {start}..{start + BLOCK - 1}")
