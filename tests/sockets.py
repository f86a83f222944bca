"""Real loopback connections for the data-plane tests, and what the kernel says about them; and
addresses where every connection is refused."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import termios
import threading
from typing import Iterator


#: the sockets behind refused_address(): bound, never listening, until the test process ends
_REFUSING: list[socket.socket] = []


def refused_address() -> str:
    """A loopback address where every connection is refused for as long as the test process runs:
    its port stays bound and never listens. A port bound and closed again would be free for the
    next port-0 bind of any process (another worker's controller, say) to take and answer on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _REFUSING.append(s)
    return f"127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def loopback_pair(receive_buffer_bytes: int = 4 << 20) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(sender, reader), connected over 127.0.0.1. The reader's receive buffer is fixed and large
    by default: the kernel also wakes a reader whose receive window is nearly full, which would
    hide what a test of wake-ups looks for."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)  # accepted sockets inherit it
        server.bind(("127.0.0.1", 0))
        server.listen()
        sender = socket.create_connection(server.getsockname())
        reader, _ = server.accept()
    with sender, reader:
        yield sender, reader


def queued(sock: socket.socket) -> int:
    """Bytes in `sock`'s receive queue (FIONREAD)."""
    return int.from_bytes(fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"), "little")


def asleep_in_kernel(thread: threading.Thread) -> bool:
    """`thread` sleeps in a system call that is not a lock's (not waiting for the GIL, not running)."""
    base = f"/proc/self/task/{thread.native_id}"
    try:
        with open(f"{base}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"{base}/wchan") as f:
            wchan = f.read()
    except FileNotFoundError:
        return False
    return state == "S" and wchan not in ("", "0") and "futex" not in wchan
