"""The sockets of a catch-up transfer: blocking, bounded by kernel timeouts, and the fetcher's GET.

A state stream moves gigabytes through `sendall` and `recv_into` on caller-owned memory (the
tensors themselves). Python's own socket timeouts would poll() before every call; the kernel's
SO_SNDTIMEO / SO_RCVTIMEO bound each call the same way without it, so the stream's sockets are
blocking with those set (an expired call raises an OSError, as a reset one does). The fetcher's
body reads instead wait in one poll() per part (`Response`, `WokenReceiver`): woken once a part
is queued rather than at each arrival, each wait bounded by the fetch's timeout.

The fetcher sends its GETs (one per lane, all before it reads any answer) and reads each response
on the raw socket: http.client would read the body through a buffered file (another bounded copy
per call and a poll per read) where the bytes can instead land in the destination tensor straight
from the kernel. A run of several small tensors moves with one `sendmsg` and one `recvmsg_into`
over all their buffers (`send_all`, `Response.read_into`).
"""

from __future__ import annotations

import http.client
import io
import socket
import struct

from ftar_kernels.woken_receive import WokenReceiver
from fthsdp.errors import TransferError

#: the response's status line and headers: a state server sends a few hundred bytes
MAX_HEAD_BYTES = 16 << 10


def use_kernel_timeouts(sock: socket.socket, timeout_s: float) -> None:
    """Make `sock` blocking, each send or receive bounded by `timeout_s` in the kernel."""
    sock.settimeout(None)
    sec = int(timeout_s)
    usec = max(1, int((timeout_s - sec) * 1e6)) if sec == 0 else int((timeout_s - sec) * 1e6)
    tv = struct.pack("ll", sec, usec)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)


class Response:
    """The answer to one GET: `status`, `headers`, and the body, read with `read_exact` (into the
    caller's memory) or `read_some` (a few bytes of an error's text). Never more than the
    Content-Length is read. The socket stays its opener's to close.

    A read is woken once `wake_bytes` of the body are queued (the fetcher's part), or all of it
    that is still to come when less (`WokenReceiver`: the body's bytes are owed for certain, the
    source sends them without waiting for us), not at each arrival; each wait is bounded by
    `timeout_s`."""

    def __init__(self, sock: socket.socket, status: int, headers: http.client.HTTPMessage, early: bytes,
                 timeout_s: float, wake_bytes: int) -> None:
        self.status, self.headers = status, headers
        self._receiver, self._timeout_s = WokenReceiver(sock, wake_bytes), timeout_s
        self._early = memoryview(early)  # body bytes that came with the head
        length = headers.get("Content-Length", "")
        if not length.isdigit():
            raise TransferError(f"the state server answered {status} without a Content-Length")
        self.left = int(length)
        if len(early) > self.left:
            raise TransferError(f"the state server sent {len(early)} bytes past a {self.left}-byte body")

    def read_exact(self, view: memoryview) -> None:
        n = len(view)
        if n > self.left:
            raise TransferError(f"the state stream is {self.left} bytes short of a {n}-byte section")
        got = min(n, len(self._early))
        if got:
            view[:got] = self._early[:got]
            self._early = self._early[got:]
        try:
            while got < n:  # the bulk of a transfer: kept to one call a loop
                k = self._receiver.receive(view[got:], self.left - got, self._timeout_s)
                if not k:
                    raise TransferError(f"state stream ended after {got} of {n} bytes of a section")
                got += k
        except OSError as exc:
            raise TransferError(f"state stream broke after {got} of {n} bytes of a section: {exc!r}") from exc
        finally:
            self.left -= got

    def read_into(self, views: list[memoryview]) -> None:
        """Fill `views` in order, each exactly: a run of several with one recvmsg_into at a time."""
        if len(views) == 1:
            self.read_exact(views[0])
            return
        n = sum(len(v) for v in views)
        if n > self.left:
            raise TransferError(f"the state stream is {self.left} bytes short of a {n}-byte section")
        todo = _Cursor(views)
        try:
            while self._early and not todo.done:
                k = todo.fill_from(self._early)
                self._early = self._early[k:]
            while not todo.done:
                bufs = todo.remaining(MAX_IOV)
                k = self._receiver.receive(bufs if len(bufs) > 1 else bufs[0], self.left - todo.moved,
                                           self._timeout_s)
                if not k:
                    raise TransferError(f"state stream ended after {todo.moved} of {n} bytes of a section")
                todo.advance(k)
        except OSError as exc:
            raise TransferError(f"state stream broke after {todo.moved} of {n} bytes of a section: {exc!r}") from exc
        finally:
            self.left -= todo.moved

    def read_some(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (for an error's text); b"" when none come."""
        buf = bytearray(min(limit, self.left))
        try:
            self.read_exact(memoryview(buf))
        except TransferError:
            pass
        return bytes(buf)


#: the most buffers one sendmsg / recvmsg_into is given (the kernel's IOV_MAX is 1024)
MAX_IOV = 512


class _Cursor:
    """A position in a list of buffers being filled or sent in order."""

    def __init__(self, views: list[memoryview]) -> None:
        self._views = [v for v in views if len(v)]
        self._i = self._off = self.moved = 0

    @property
    def done(self) -> bool:
        return self._i == len(self._views)

    def remaining(self, most: int) -> list[memoryview]:
        first = self._views[self._i][self._off:]
        return [first, *self._views[self._i + 1:self._i + most]]

    def advance(self, k: int) -> None:
        self.moved += k
        while k:
            left = len(self._views[self._i]) - self._off
            if k < left:
                self._off += k
                return
            k -= left
            self._i, self._off = self._i + 1, 0

    def fill_from(self, data: memoryview) -> int:
        """Copy the start of `data` into the current buffer; how many bytes."""
        view = self._views[self._i]
        k = min(len(data), len(view) - self._off)
        view[self._off:self._off + k] = data[:k]
        self.advance(k)
        return k


def send_all(sock: socket.socket, views: list[memoryview]) -> None:
    """Send `views` in order, each whole: a run of several with one sendmsg at a time. Raises OSError."""
    if len(views) == 1:
        sock.sendall(views[0])
        return
    todo = _Cursor(views)
    while not todo.done:
        k = sock.sendmsg(todo.remaining(MAX_IOV))
        if not k:
            raise ConnectionError("the state stream's socket took no bytes")
        todo.advance(k)


def send_get(address: str, target: str, headers: dict[str, str], timeout_s: float) -> socket.socket:
    """Connect to HOST:PORT and send `GET target`; the answer is read by `read_response` (so
    that several requests can be on their way before the first answer is read). Raises OSError."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    try:
        use_kernel_timeouts(sock, timeout_s)
        lines = [f"GET {target} HTTP/1.1", f"Host: {address}", *(f"{k}: {v}" for k, v in headers.items()),
                 "Connection: close", "", ""]
        sock.sendall("\r\n".join(lines).encode("latin-1"))
        return sock
    except BaseException:
        sock.close()
        raise


def read_response(sock: socket.socket, address: str, timeout_s: float, wake_bytes: int) -> Response:
    """The response's head, read from `sock` (which the caller closes, whatever happens); the
    body's reads each wait at most `timeout_s`, woken once `wake_bytes` are queued. Raises
    TransferError (a malformed answer) or OSError (the connection)."""
    head = bytearray()
    while (end := head.find(b"\r\n\r\n")) < 0:
        if len(head) > MAX_HEAD_BYTES:
            raise TransferError(f"{address} sent more than {MAX_HEAD_BYTES} bytes without ending its head")
        chunk = sock.recv(4096)
        if not chunk:
            raise TransferError(f"{address} closed the connection before answering")
        head += chunk
    status_line, _, fields = bytes(head[:end + 2]).partition(b"\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise TransferError(f"{address} answered with a malformed status line {status_line[:100]!r}")
    try:
        parsed = http.client.parse_headers(io.BytesIO(fields + b"\r\n"))
    except http.client.HTTPException as exc:
        raise TransferError(f"{address} answered with malformed headers: {exc!r}") from None
    return Response(sock, int(parts[1]), parsed, bytes(head[end + 4:]), timeout_s, wake_bytes)
