"""Which thread sends: the runner itself while the transport takes each chunk at once, the
generation's one sender thread (started with the generation, not per operation) for the rest of
an operation from the first chunk it does not; and a sender's error fails the operation and
breaks the generation as the runner's own do."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from ftar_kernels import FatalError, FtarEndpoint, RecoverableError, TcpTransport
from ftar_kernels.errors import NotReady
from ftar_kernels.ring_plan import ring_steps, step_chunks
from ftar_kernels.ring_run import runner_may_send
from ftar_kernels.transport import Connection, WrappedConnection, WrappedTransport

from .cluster import parallel
from .test_in_process import SETTINGS, allreduce_all, configure, ftar_threads


class SenderSeam:
    """Shared by every connection of one seamed transport: which threads sent chunks, how many bytes
    `try_send` may still take (None: as many as the socket takes), and an error to raise in the
    sender thread's n-th chunk send from now."""

    def __init__(self, try_budget: int | None = None) -> None:
        self.lock = threading.Lock()
        self.chunk_senders: list[threading.Thread] = []
        self.try_budget = try_budget
        self.fail_in: int | None = None
        self.error: BaseException | None = None

    def fail_sender(self, error: BaseException, after_sends: int = 0) -> None:
        with self.lock:
            self.fail_in, self.error = after_sends, error

    def on_send(self, data) -> None:
        thread = threading.current_thread()
        if not thread.name.startswith(("ftar-run", "ftar-send")) or len(data) == 1:
            return  # a hello, or a credit byte
        if thread.name.startswith("ftar-run") and len(data) == 32:
            return  # the operation's header
        with self.lock:
            self.chunk_senders.append(thread)
            if self.fail_in is None or not thread.name.startswith("ftar-send"):
                return
            if self.fail_in > 0:
                self.fail_in -= 1
                return
            error, self.fail_in, self.error = self.error, None, None
        raise error

    def allowance(self, n: int) -> int:
        with self.lock:
            if self.try_budget is None:
                return n
            take, self.try_budget = min(n, self.try_budget), self.try_budget - min(n, self.try_budget)
            return take


class SeamConnection(WrappedConnection):
    def __init__(self, inner: Connection, seam: SenderSeam) -> None:
        super().__init__(inner)
        self._seam = seam

    def send_all(self, data, timeout_s: float) -> None:
        self._seam.on_send(data)
        self.inner.send_all(data, timeout_s)

    def try_send(self, data) -> int:
        allowed = self._seam.allowance(len(data))
        if not allowed:
            return 0
        self._seam.on_send(data)
        return self.inner.try_send(memoryview(data)[:allowed])


def seamed(n: int, try_budget: int | None = None, settings=SETTINGS) -> tuple[list[FtarEndpoint], list[SenderSeam]]:
    seams = [SenderSeam(try_budget) for _ in range(n)]
    return [FtarEndpoint("127.0.0.1", 0, settings,
                         transport=WrappedTransport(TcpTransport(), lambda conn, s=s: SeamConnection(conn, s)))
            for s in seams], seams


def configured(eps: list[FtarEndpoint], seams: list[SenderSeam], generation: int = 1) -> None:
    configure(eps, generation)
    for seam in seams:
        with seam.lock:
            seam.chunk_senders.clear()


def inputs(world: int, numel: int, dtype=torch.float32, seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Small integers (every partial sum exact) and their sum."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-20, 21, (numel,), generator=gen).to(dtype) for _ in range(world)]
    return xs, sum(x.to(torch.float64) for x in xs).to(dtype)


def twenty_sums(eps: list[FtarEndpoint], threads: int) -> None:
    """20 all-reduces of 3 ranks, each the exact sum, with `threads` threads alive after each
    (4 KiB chunks, 2 in flight: several chunks a step, two partitions)."""
    for i in range(20):
        xs, want = inputs(3, 9000 + i, seed=i)
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert all(torch.equal(x, want) for x in xs)
        assert threading.active_count() == threads


def test_a_small_all_reduce_runs_on_the_runner_alone():
    eps, seams = seamed(3)
    try:
        configured(eps, seams)
        before = threading.active_count()
        twenty_sums(eps, before)
        for seam in seams:
            assert len(seam.chunk_senders) >= 20 * 8
            assert {t.name for t in seam.chunk_senders} == {"ftar-run-g1"}
    finally:
        parallel(*[e.close for e in eps])


def test_a_generation_sends_every_operation_from_one_thread_started_once():
    eps, seams = seamed(3, try_budget=0)  # the transport never takes a chunk at once
    try:
        configured(eps, seams)
        before = threading.active_count()
        assert ftar_threads().count("ftar-send") == 3  # started with the generation, one a rank
        twenty_sums(eps, before)
        for seam in seams:
            assert len(seam.chunk_senders) >= 20 * 8
            assert len(set(seam.chunk_senders)) == 1, set(seam.chunk_senders)
            assert seam.chunk_senders[0].name == "ftar-send-g1"
    finally:
        parallel(*[e.close for e in eps])
    assert "ftar-send" not in ftar_threads()


@pytest.mark.parametrize("budget", [1000, 5000, 20000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_operation_handed_to_the_sender_mid_chunk_sums_like_the_reference(budget, dtype):
    # The transport takes `budget` bytes at once and then nothing: the runner sends the first
    # chunks itself, part of one more, and the sender thread sends the rest of it and the rest.
    eps, seams = seamed(3, try_budget=budget)
    try:
        configured(eps, seams)
        xs, want = inputs(3, 5 * 4096 // xs_size(dtype) + 11, dtype)
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert all(torch.equal(x, want) for x in xs)
        for seam in seams:
            assert {t.name for t in seam.chunk_senders} == {"ftar-run-g1", "ftar-send-g1"}
        xs, want = inputs(3, 3001, dtype, seed=1)  # the next operation starts with the sender idle
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert all(torch.equal(x, want) for x in xs)
    finally:
        parallel(*[e.close for e in eps])


def xs_size(dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


@pytest.mark.parametrize("sent, acked, step_start, may", [
    (0, 0, 0, True),     # nothing in flight
    (5, 4, 5, True),     # one chunk in flight, a window of two: room
    (6, 4, 6, True),     # window full, the credit owed is for chunk 4, sent in an earlier step: wait
    (7, 5, 6, True),     # window full, owed for chunk 5, earlier step: wait
    (8, 6, 6, False),    # window full, owed for chunk 6, this step: the sender waits, not the runner
    (9, 6, 6, False),    # (and past the window: never the runner)
    (8, 7, 6, True),     # that credit came: room
])
def test_the_runner_waits_only_for_credits_owed_for_earlier_steps(sent, acked, step_start, may):
    assert runner_may_send(sent, acked, 2, step_start) is may


def more_chunks_than_window(world: int, settings) -> list[int]:
    """Element counts (bfloat16) for which some rank has a step of more chunks than the window
    (alignment stretches the last segment): its last chunk needs a credit for one of that step."""
    ce, c = settings.chunk_bytes // 2, settings.chunks_in_flight
    return [n for n in range(2, 600) if any(
        len(sc.sends) > c for r in range(world) for sc in step_chunks(ring_steps(r, world, n, ce, c, 8), ce, c, 8))]


@pytest.mark.parametrize("world", [2, 3])
def test_steps_of_more_chunks_than_the_window_sum_like_the_reference(world):
    # 64-byte chunks, one in flight: some steps have two chunks, so a runner sending its step
    # meets a credit owed for that same step (`runner_may_send`).
    settings = dataclasses.replace(SETTINGS, chunk_bytes=64, chunks_in_flight=1, timeout_s=2.0)
    sizes = more_chunks_than_window(world, settings)[:6]
    assert len(sizes) == 6
    eps, seams = seamed(world, settings=settings)
    try:
        configured(eps, seams)
        for n in sizes:
            xs, want = inputs(world, n, torch.bfloat16, seed=n)
            results = allreduce_all(eps, xs)
            assert all(not isinstance(r, Exception) for r in results), (n, results)
            assert all(torch.equal(x, want) for x in xs)
    finally:
        parallel(*[e.close for e in eps])


@pytest.mark.parametrize("injected, kind", [(RecoverableError("injected: reset while sending"), RecoverableError),
                                            (RuntimeError("injected: the sender's bug"), FatalError)])
def test_an_error_in_the_sender_fails_the_operation_everywhere_and_breaks_the_generation(injected, kind):
    eps, seams = seamed(2, try_budget=0)
    try:
        configured(eps, seams)
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
        for handle in queued:  # cancelled, or refused if the failure came before it was queued
            with pytest.raises(RecoverableError, match="cancelled|can no longer|aborted"):
                handle.wait(10.0)
        assert eps[0].state.value == "aborted"
        with pytest.raises(NotReady, match="aborted"):
            eps[0].allreduce(torch.ones(3)).wait(1.0)
        # The broken generation's senders are joined by the reconfiguration; the new ring works.
        configured(eps, seams, 2)
        assert not any(t.is_alive() for t in senders)
        assert ftar_threads().count("ftar-send") == 2
        xs = [torch.ones(3000), torch.ones(3000)]
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert torch.equal(xs[0], torch.full((3000,), 2.0)) and torch.equal(xs[1], xs[0])
    finally:
        parallel(*[e.close for e in eps])


class Stuck(WrappedConnection):
    """Once `armed`, a connection whose reads (or sends) ignore their timeout and interrupt() (a
    broken transport): one blocks until the test sets `release` (at most 60 s), then fails.
    With stuck sends `try_send` takes nothing, so every chunk goes to the sender thread, whose
    sends block (the runner's own header and credits go through)."""

    def __init__(self, inner: Connection, sends: bool, armed: threading.Event, entered: threading.Event,
                 release: threading.Event) -> None:
        super().__init__(inner)
        self._sends, self._armed, self._entered, self._release = sends, armed, entered, release

    def _stuck(self) -> None:
        self._entered.set()
        self._release.wait(60.0)
        raise ConnectionResetError("released by the test")

    def recv_exact(self, into, timeout_s: float) -> None:
        if self._armed.is_set() and not self._sends:
            self._stuck()
        self.inner.recv_exact(into, timeout_s)

    def try_send(self, data) -> int:
        return 0 if self._armed.is_set() and self._sends else self.inner.try_send(data)

    def send_all(self, data, timeout_s: float) -> None:
        if self._armed.is_set() and self._sends and threading.current_thread().name.startswith("ftar-send"):
            self._stuck()
        self.inner.send_all(data, timeout_s)

    def interrupt(self) -> None:
        if not self._armed.is_set():
            self.inner.interrupt()


@pytest.mark.parametrize("sends, thread", [(False, "runner"), (True, "sender")])
def test_close_is_bounded_even_when_a_thread_is_stuck_in_a_transport_that_ignores_interrupt(caplog, sends, thread):
    """Every wait bounded: close() gives up on the runner (stuck in a read) or the sender thread
    (stuck in a send) after timeout_s + 5 s, says which, and leaves it behind (it ends when the
    read or send does)."""
    armed, entered, release = threading.Event(), threading.Event(), threading.Event()
    settings = dataclasses.replace(SETTINGS, timeout_s=0.5)
    eps = [FtarEndpoint("127.0.0.1", 0, settings, transport=WrappedTransport(  # only rank 0's transport breaks
        TcpTransport(), lambda c, a=a: Stuck(c, sends, a, entered, release))) for a in (armed, threading.Event())]
    try:
        configure(eps, 1)
        armed.set()
        # stuck reads: rank 1 never joins, so rank 0's runner reads; stuck sends: both run, and
        # rank 0's chunks go to its sender thread
        for ep in eps[:2 if sends else 1]:
            ep.allreduce(torch.ones(4096))
        assert entered.wait(10), f"the {thread} never got stuck"
        closer = threading.Thread(target=eps[0].close, daemon=True)
        closer.start()
        closer.join(30.0)
        assert not closer.is_alive() and not release.is_set()  # returned while the thread is still stuck
        assert any(f"{thread} thread did not stop within 5.5 s" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
        armed.clear()
        for ep in eps:
            ep.close()
