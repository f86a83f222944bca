"""Transports behind one small interface: a listener that accepts, a dialer, a byte connection.

TCP is the only shipped transport. The interface is shaped for an RDMA (pyverbs) one too: data
moves only between caller-owned memoryviews that the caller preallocates and reuses
(`send_all`, `try_send`, `recv_exact`, `recv_some`; an RDMA transport would post work requests
on them and wait for their completions), `interrupt()` wakes a blocked caller from another
thread, and `register()` is the hook where an RDMA transport registers those buffers (TCP does
nothing).
Every socket error becomes RecoverableError.
"""

from __future__ import annotations

import abc
import errno
import selectors
import socket
import struct
import time
from typing import Callable

from .errors import RecoverableError
from .woken_receive import WokenReceiver


class Connection(abc.ABC):
    """A reliable, ordered byte stream to one peer. One reader and one writer may run at once."""

    peer: str

    @abc.abstractmethod
    def send_all(self, data: memoryview | bytes, timeout_s: float) -> None: ...

    def try_send(self, data: memoryview | bytes) -> int:
        """Send what the transport takes at once, without waiting; how many bytes it took (0 to
        len(data)). A transport that cannot tell takes nothing, and every byte goes through
        `send_all` (FTAR's sender thread)."""
        return 0

    @abc.abstractmethod
    def recv_exact(self, into: memoryview, timeout_s: float) -> None: ...

    @abc.abstractmethod
    def recv_some(self, into: memoryview, timeout_s: float) -> int:
        """Block until at least one byte arrives; return how many were written into `into`."""

    def register(self, buffer: memoryview) -> None:
        """Hook for transports that must register memory before using it (RDMA). TCP: nothing."""

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Wake any thread blocked on this connection; it then fails with RecoverableError."""

    @abc.abstractmethod
    def close(self) -> None: ...


class Listener(abc.ABC):
    address: str

    @abc.abstractmethod
    def accept(self, timeout_s: float) -> Connection | None:
        """A new connection, or None on timeout or after `wake()`."""

    @abc.abstractmethod
    def wake(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class Transport(abc.ABC):
    @abc.abstractmethod
    def listen(self, host: str, port: int) -> Listener: ...

    @abc.abstractmethod
    def dial(self, address: str, timeout_s: float) -> Connection:
        """Connect, retrying refused attempts until timeout_s; RecoverableError past it."""


class WrappedConnection(Connection):
    """`inner`'s stream, every call passed on to it: the base of a connection that watches or
    shapes another's traffic (fault injection, a paced link). Override what changes."""

    def __init__(self, inner: Connection) -> None:
        self.inner, self.peer = inner, inner.peer

    def send_all(self, data: memoryview | bytes, timeout_s: float) -> None:
        self.inner.send_all(data, timeout_s)

    def try_send(self, data: memoryview | bytes) -> int:
        return self.inner.try_send(data)

    def recv_exact(self, into: memoryview, timeout_s: float) -> None:
        self.inner.recv_exact(into, timeout_s)

    def recv_some(self, into: memoryview, timeout_s: float) -> int:
        return self.inner.recv_some(into, timeout_s)

    def register(self, buffer: memoryview) -> None:
        self.inner.register(buffer)

    def interrupt(self) -> None:
        self.inner.interrupt()

    def close(self) -> None:
        self.inner.close()


class _WrappedListener(Listener):
    def __init__(self, inner: Listener, wrap: Callable[[Connection], Connection]) -> None:
        self._inner, self._wrap, self.address = inner, wrap, inner.address

    def accept(self, timeout_s: float) -> Connection | None:
        conn = self._inner.accept(timeout_s)
        return None if conn is None else self._wrap(conn)

    def wake(self) -> None:
        self._inner.wake()

    def close(self) -> None:
        self._inner.close()


class WrappedTransport(Transport):
    """`inner` with every connection it accepts or dials wrapped by `wrap` (a WrappedConnection)."""

    def __init__(self, inner: Transport, wrap: Callable[[Connection], Connection]) -> None:
        self.inner, self._wrap = inner, wrap

    def listen(self, host: str, port: int) -> Listener:
        return _WrappedListener(self.inner.listen(host, port), self._wrap)

    def dial(self, address: str, timeout_s: float) -> Connection:
        return self._wrap(self.inner.dial(address, timeout_s))


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must look like HOST:PORT, got {address!r}.")
    return host.strip("[]"), int(port)


class TcpConnection(Connection):
    def __init__(self, sock: socket.socket, peer: str, buffer_bytes: int = 0) -> None:
        self._sock = sock
        self.peer = peer
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        self._timeout: float | None = None
        self._receiver = WokenReceiver(sock)

    def _arm(self, timeout_s: float) -> None:
        """Bound every blocking send with a kernel timeout (SO_SNDTIMEO).

        The socket stays in blocking mode: Python's own timeout mode would poll() before every
        send, which costs a third of loopback bandwidth on big transfers. Receives wait in their
        own poll(), bounded there (`WokenReceiver`)."""
        if timeout_s != self._timeout:
            sec = int(timeout_s)
            tv = struct.pack("ll", sec, max(1, int((timeout_s - sec) * 1e6)) if sec == 0 else int((timeout_s - sec) * 1e6))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self._timeout = timeout_s

    def _fail(self, what: str, exc: BaseException, timeout_s: float) -> RecoverableError:
        if isinstance(exc, (socket.timeout, TimeoutError, BlockingIOError)):
            return RecoverableError(f"timed out after {timeout_s} s {what} peer {self.peer}")
        return RecoverableError(f"connection to peer {self.peer} failed while {what}: {exc!r}")

    def send_all(self, data, timeout_s: float) -> None:
        self._arm(timeout_s)
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise self._fail("sending to", exc, timeout_s) from exc

    def try_send(self, data) -> int:
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:  # the socket's buffer is full
            return 0
        except OSError as exc:
            raise self._fail("sending to", exc, 0.0) from exc

    def recv_exact(self, into: memoryview, timeout_s: float) -> None:
        """Woken once 512 KiB of what is due is in, not at each arrival (`woken_receive`)."""
        got, n = 0, len(into)
        try:
            while got < n:
                k = self._receiver.receive(into[got:], n - got, timeout_s)
                if k == 0:
                    raise RecoverableError(f"peer {self.peer} closed the connection")
                got += k
        except OSError as exc:  # TimeoutError included
            raise self._fail("receiving from", exc, timeout_s) from exc

    def recv_some(self, into: memoryview, timeout_s: float) -> int:
        try:
            k = self._receiver.receive(into, 1, timeout_s)
        except OSError as exc:  # TimeoutError included
            raise self._fail("receiving from", exc, timeout_s) from exc
        if k == 0:
            raise RecoverableError(f"peer {self.peer} closed the connection")
        return k

    def interrupt(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.interrupt()
        self._sock.close()


class TcpListener(Listener):
    def __init__(self, host: str, port: int, buffer_bytes: int = 0) -> None:
        self._buffer_bytes = buffer_bytes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if buffer_bytes:  # accepted sockets inherit these; set before listen for window scaling
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        try:  # SO_REUSEADDR reuses TIME_WAIT ports only: a port another process listens on is refused
            self._sock.bind((host, port))
            self._sock.listen(128)
        except OSError as exc:
            self._sock.close()
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        bound = self._sock.getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"

    def accept(self, timeout_s: float) -> Connection | None:
        for key, _ in self._selector.select(timeout_s):
            if key.fileobj is self._wake_r:
                try:
                    self._wake_r.recv(64)
                except OSError:
                    pass
                return None
        try:
            sock, addr = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        sock.setblocking(True)
        return TcpConnection(sock, f"{addr[0]}:{addr[1]}", self._buffer_bytes)

    def wake(self) -> None:
        try:
            self._wake_w.send(b"!")
        except OSError:
            pass

    def close(self) -> None:
        self._selector.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()


class TcpTransport(Transport):
    def __init__(self, buffer_bytes: int = 0) -> None:
        self.buffer_bytes = buffer_bytes

    def listen(self, host: str, port: int) -> Listener:
        return TcpListener(host, port, self.buffer_bytes)

    def dial(self, address: str, timeout_s: float) -> Connection:
        host, port = split_address(address)
        deadline = time.monotonic() + timeout_s
        pause = 0.01
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RecoverableError(f"could not reach peer {address} within {timeout_s} s")
            try:
                sock = socket.create_connection((host, port), timeout=left)
                return TcpConnection(sock, address, self.buffer_bytes)
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, None) \
                        and not isinstance(exc, TimeoutError):
                    raise RecoverableError(f"could not reach peer {address}: {exc!r}") from exc
            # A refused dial: the peer's process may still be starting. Back off, bounded.
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.2)
