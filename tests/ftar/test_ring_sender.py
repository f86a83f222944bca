"""The generation's one sender thread: every operation's chunks leave from it, and its errors
fail the operation and break the generation as the runner's own do."""

from __future__ import annotations

import threading

import pytest
import torch

from ftar_kernels import FatalError, FtarEndpoint, RecoverableError, TcpTransport
from ftar_kernels.errors import NotReady
from ftar_kernels.transport import Connection, Listener, Transport

from .cluster import parallel
from .test_in_process import SETTINGS, allreduce_all, configure, ftar_threads


class SenderSeam:
    """Shared by every connection of one SeamTransport: which threads sent data, and an error to
    raise in the sender thread's n-th data send from now."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data_senders: list[threading.Thread] = []
        self.fail_in: int | None = None
        self.error: BaseException | None = None

    def fail_sender(self, error: BaseException, after_sends: int = 0) -> None:
        with self.lock:
            self.fail_in, self.error = after_sends, error

    def on_send(self, data) -> None:
        thread = threading.current_thread()
        if len(data) <= 64:  # a header or a credit byte, not a chunk (chunks here are >= 1 KiB)
            return
        with self.lock:
            self.data_senders.append(thread)
            if self.fail_in is None or not thread.name.startswith("ftar-send"):
                return
            if self.fail_in > 0:
                self.fail_in -= 1
                return
            error, self.fail_in, self.error = self.error, None, None
        raise error


class SeamConnection(Connection):
    def __init__(self, inner: Connection, seam: SenderSeam) -> None:
        self._inner, self._seam, self.peer = inner, seam, inner.peer

    def send_all(self, data, timeout_s: float) -> None:
        self._seam.on_send(data)
        self._inner.send_all(data, timeout_s)

    def recv_exact(self, into, timeout_s: float) -> None:
        self._inner.recv_exact(into, timeout_s)

    def recv_some(self, into, timeout_s: float) -> int:
        return self._inner.recv_some(into, timeout_s)

    def interrupt(self) -> None:
        self._inner.interrupt()

    def close(self) -> None:
        self._inner.close()


class SeamListener(Listener):
    def __init__(self, inner: Listener, seam: SenderSeam) -> None:
        self._inner, self._seam, self.address = inner, seam, inner.address

    def accept(self, timeout_s: float):
        conn = self._inner.accept(timeout_s)
        return None if conn is None else SeamConnection(conn, self._seam)

    def wake(self) -> None:
        self._inner.wake()

    def close(self) -> None:
        self._inner.close()


class SeamTransport(Transport):
    def __init__(self, seam: SenderSeam) -> None:
        self._inner, self._seam = TcpTransport(), seam

    def listen(self, host: str, port: int) -> Listener:
        return SeamListener(self._inner.listen(host, port), self._seam)

    def dial(self, address: str, timeout_s: float) -> Connection:
        return SeamConnection(self._inner.dial(address, timeout_s), self._seam)


def seamed(n: int) -> tuple[list[FtarEndpoint], list[SenderSeam]]:
    seams = [SenderSeam() for _ in range(n)]
    return [FtarEndpoint("127.0.0.1", 0, SETTINGS, transport=SeamTransport(s)) for s in seams], seams


def test_a_generation_sends_every_operation_from_one_thread_started_once():
    eps, seams = seamed(3)
    try:
        configure(eps, 1)
        for seam in seams:
            seam.data_senders.clear()  # the hellos' sends
        before = threading.active_count()
        assert ftar_threads().count("ftar-send") == 3  # started with the generation, one a rank
        # 20 operations, each several chunks (4 KiB chunks, 2 in flight) over more than one partition
        for i in range(20):
            xs = [torch.full((9000 + i,), float(r + 1)) for r in range(3)]
            assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
            assert all(torch.equal(x, torch.full((9000 + i,), 6.0)) for x in xs)
            assert threading.active_count() == before
        for seam in seams:
            assert len(seam.data_senders) >= 20 * 4  # every chunk was seen
            assert len(set(seam.data_senders)) == 1, set(seam.data_senders)
            assert seam.data_senders[0].name == "ftar-send-g1"
    finally:
        parallel(*[e.close for e in eps])
    assert "ftar-send" not in ftar_threads()


@pytest.mark.parametrize("injected, kind", [(RecoverableError("injected: reset while sending"), RecoverableError),
                                            (RuntimeError("injected: the sender's bug"), FatalError)])
def test_an_error_in_the_sender_fails_the_operation_everywhere_and_breaks_the_generation(injected, kind):
    eps, seams = seamed(2)
    try:
        configure(eps, 1)
        xs = [torch.ones(3000), torch.ones(3000)]
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))  # credits in flight now
        senders = [t for t in threading.enumerate() if t.name == "ftar-send-g1"]
        seams[0].fail_sender(injected, after_sends=1)  # the sender's second chunk of the next operation
        first = [e.allreduce(torch.ones(3000)) for e in eps]
        queued = [e.allreduce(torch.ones(10)) for e in eps]
        with pytest.raises(kind, match="injected" if kind is RecoverableError else "sender's bug"):
            first[0].wait(10.0)
        with pytest.raises(RecoverableError):  # the peer sees its ring closed
            first[1].wait(10.0)
        for handle in queued:
            with pytest.raises(RecoverableError, match="cancelled|can no longer"):
                handle.wait(10.0)
        assert eps[0].state.value == "aborted"
        with pytest.raises(NotReady, match="aborted"):
            eps[0].allreduce(torch.ones(3)).wait(1.0)
        # The broken generation's senders are joined by the reconfiguration; the new ring works.
        configure(eps, 2)
        assert not any(t.is_alive() for t in senders)
        assert ftar_threads().count("ftar-send") == 2
        xs = [torch.ones(3000), torch.ones(3000)]
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert torch.equal(xs[0], torch.full((3000,), 2.0)) and torch.equal(xs[1], xs[0])
    finally:
        parallel(*[e.close for e in eps])
