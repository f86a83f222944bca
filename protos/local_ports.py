"""Loopback ports for processes that listen later, picked where nothing takes them meanwhile.

A port found free now and listened on later can be taken in between. A port found by binding
port 0 comes from the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
32768-60999 on Linux by default), where every port-0 bind and outgoing connection draws too: a
diagnosis demo's controller once got the port that one replica's gloo store was to listen on,
and that replica never trained. So ports for later come from below that range, in two parts
that never meet:

- `window()`, the WINDOW ports just below the ephemeral range: `listen_port()` hands them out in
  turn from a start of the process's own (the demo's trainers, the benchmarks' services);
- below the window, the agent's picks (agent/ports.py: the rendezvous and coordinator ports it
  registers for its host).
"""

from __future__ import annotations

import os
import socket
import threading

#: the window's size below the ephemeral range (30068-32767 by default)
WINDOW = 2700
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_lock = threading.Lock()
_turn: list[int] = []


def ephemeral_low(default: int = 32768, range_file: str = _EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (`default` where it cannot be read)."""
    try:
        with open(range_file) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def window(range_file: str = _EPHEMERAL_RANGE) -> range:
    """The ports `listen_port` hands out: WINDOW ports below the ephemeral range's first; empty
    where that range starts too low to leave them room above 1024."""
    low = ephemeral_low(range_file=range_file)
    return range(low - WINDOW, low) if low - WINDOW >= 1024 else range(0)


def is_free(port: int) -> bool:
    """Nothing listens on `port` on any interface (as a rendezvous store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def listen_port(ports: range | None = None) -> int:
    """A TCP port nobody listens on now, for a process that will listen on it later, from `ports`
    (default: `window()`), in turn; a port-0 pick where that is empty. RuntimeError naming the
    range when every port in it is taken."""
    ports = window() if ports is None else ports
    if not ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    with _lock:
        if not _turn:
            _turn.append(os.getpid() * 7919)
        for _ in range(len(ports)):
            port = ports[_turn[0] % len(ports)]
            _turn[0] += 1
            if is_free(port):
                return port
    raise RuntimeError(f"no free loopback port in {ports.start}..{ports.stop - 1}")
