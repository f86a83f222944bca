"""In-process endpoints: no leaks across reconfigurations, injected faults, argument errors."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch

from ftar_kernels import (
    FatalError, Faults, FaultyTransport, FtarEndpoint, FtarSettings, RecoverableError, TcpTransport,
)

from tests.sockets import refused_address

from .cluster import KEY, parallel

SETTINGS = FtarSettings(chunk_bytes=4096, chunks_in_flight=2, timeout_s=5.0, connect_timeout_s=5.0, auth_key=KEY)


def endpoints(n: int, faults: list[Faults] | None = None) -> list[FtarEndpoint]:
    faults = faults or [Faults() for _ in range(n)]
    return [FtarEndpoint("127.0.0.1", 0, SETTINGS, transport=FaultyTransport(TcpTransport(), f))
            for f in faults]


def configure(eps: list[FtarEndpoint], generation: int, group: str = "t/rank0") -> None:
    members = [e.address for e in eps]
    results = parallel(*[lambda e=e: e.configure(group, generation, members) for e in eps])
    assert all(r is None for r in results), results


def allreduce_all(eps: list[FtarEndpoint], tensors: list[torch.Tensor], wait_s: float = 10.0) -> list:
    handles = [e.allreduce(t) for e, t in zip(eps, tensors)]
    out = []
    for h in handles:
        try:
            out.append(h.wait(wait_s))
        except (RecoverableError, FatalError) as exc:
            out.append(exc)
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def ftar_threads() -> list[str]:
    """Names of live FTAR threads, less the generation suffix (ftar-run-g17 -> ftar-run)."""
    return sorted(t.name.split("-g")[0] for t in threading.enumerate() if t.name.startswith("ftar-"))


def test_no_thread_or_socket_leak_across_50_reconfigurations():
    fds_before, threads_before = open_fds(), ftar_threads()
    eps = endpoints(3)
    configure(eps, 1)
    fds_configured, threads_configured = open_fds(), ftar_threads()
    for generation in range(2, 52):
        configure(eps, generation)
        if generation % 10 == 0:
            xs = [torch.full((5000,), float(i)) for i in range(3)]
            assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
            assert all(torch.equal(x, torch.full((5000,), 3.0)) for x in xs)
    assert ftar_threads() == threads_configured
    assert open_fds() == fds_configured
    parallel(*[e.close for e in eps])
    assert ftar_threads() == threads_before
    assert open_fds() == fds_before


def test_injected_failure_is_recoverable_everywhere_and_queued_work_is_cancelled():
    faults = [Faults(), Faults()]
    a, b = eps = endpoints(2, faults)
    try:
        configure(eps, 1)
        faults[0].fail_next(RecoverableError("injected: peer reset"))
        first = [e.allreduce(torch.ones(3000)) for e in eps]
        queued = [e.allreduce(torch.ones(10)) for e in eps]
        for h in first + queued:
            with pytest.raises(RecoverableError):
                h.wait(10.0)
        assert a.state.value == "aborted"
        configure(eps, 2)
        xs = [torch.ones(3000), torch.ones(3000)]
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert torch.equal(xs[0], torch.full((3000,), 2.0))
    finally:
        parallel(a.close, b.close)


def test_local_device_failure_is_fatal_locally_and_recoverable_for_the_peer():
    faults = [Faults(), Faults()]
    a, b = eps = endpoints(2, faults)
    try:
        configure(eps, 1)
        faults[0].fail_next(RuntimeError("injected: device lost"))
        results = allreduce_all(eps, [torch.ones(3000), torch.ones(3000)])
        assert isinstance(results[0], FatalError) and isinstance(results[1], RecoverableError), results
    finally:
        parallel(a.close, b.close)


def test_reconfigure_cancels_an_operation_that_waits_for_a_peer():
    a, b = eps = endpoints(2)
    try:
        configure(eps, 1)
        handle = a.allreduce(torch.ones(100))  # b never joins this operation
        with pytest.raises(RecoverableError, match="did not finish"):
            handle.wait(0.2)
        configure(eps, 2)
        with pytest.raises(RecoverableError):
            handle.wait(10.0)
        xs = [torch.ones(100, dtype=torch.float16), torch.ones(100, dtype=torch.float16)]
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
    finally:
        parallel(a.close, b.close)


def test_non_contiguous_tensor_is_reduced_in_place():
    a, b = eps = endpoints(2)
    try:
        configure(eps, 1)
        xs = [torch.arange(2000.0).reshape(40, 50)[:, ::3] for _ in range(2)]
        want = xs[0] * 2
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert torch.equal(xs[0], want) and torch.equal(xs[1], want)
    finally:
        parallel(a.close, b.close)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_chunks_received_in_many_fold_pieces_sum_like_a_naive_reference(world, dtype):
    # 4 KiB chunks folded in 192-byte pieces: most chunks arrive as several pieces, the last one
    # short, so the piece arithmetic (element offsets per dtype, the staging buffer reused for
    # every piece) is what the sum checks. Small integers: every partial sum is exact.
    settings = dataclasses.replace(SETTINGS, cpu_fold_bytes=192)
    eps = [FtarEndpoint("127.0.0.1", 0, settings) for _ in range(world)]
    try:
        configure(eps, 1)
        gen = torch.Generator().manual_seed(world)
        numel = 3 * 4096 // torch.tensor([], dtype=dtype).element_size() * world + 37
        xs = [torch.randint(-20, 21, (numel,), generator=gen).to(dtype) for _ in range(world)]
        want = sum(x.to(torch.float64) for x in xs).to(dtype)
        assert all(not isinstance(r, Exception) for r in allreduce_all(eps, xs))
        assert all(torch.equal(x, want) for x in xs)
    finally:
        parallel(*[e.close for e in eps])


def test_argument_errors():
    ep = FtarEndpoint("127.0.0.1", 0, SETTINGS)
    try:
        with pytest.raises(RecoverableError, match="not configured"):
            ep.allreduce(torch.ones(3)).wait(1.0)
        with pytest.raises(FatalError, match="int64"):
            ep.allreduce(torch.ones(3, dtype=torch.int64))
        with pytest.raises(FatalError, match="do not include"):
            ep.configure("g", 1, ["127.0.0.1:1"])
        with pytest.raises(FatalError, match="more than once"):
            ep.configure("g", 1, [ep.address, ep.address])
        ep.configure("g", 3, [ep.address])
        x = torch.ones(7, dtype=torch.bfloat16)
        assert ep.allreduce(x).wait(1.0).bytes == 14 and torch.equal(x, torch.ones(7, dtype=torch.bfloat16))
        with pytest.raises(FatalError, match="older than the current generation 3"):
            ep.configure("g", 2, [ep.address])
    finally:
        ep.close()
        ep.close()  # idempotent
    with pytest.raises(FatalError, match="closed"):
        ep.configure("g", 4, [ep.address])


def test_unreachable_peer_is_recoverable_within_the_connect_timeout():
    dead = refused_address()  # bound, never listening: refused
    ep = FtarEndpoint("127.0.0.1", 0, FtarSettings(connect_timeout_s=0.3, auth_key=KEY))
    try:
        with pytest.raises(RecoverableError, match="could not reach"):
            ep.configure("g", 1, [ep.address, dead])
    finally:
        ep.close()


def test_a_peer_of_another_group_is_refused_fatally():
    a, b = endpoints(2)
    try:
        configure([a], 1, group="job/rank0")
        b.settings  # b believes it is in another group
        results = parallel(lambda: b.configure("job/rank1", 1, [b.address, a.address]))
        assert isinstance(results[0], FatalError) and "serves group" in str(results[0])
    finally:
        parallel(a.close, b.close)


def test_a_neighbour_leaving_right_after_its_own_success_does_not_fail_this_rank():
    # b's sends (data and credit bytes) are slow, so a finishes first and closes while b still owes
    # a its last credits; those are no longer needed, so b's operation must still succeed.
    faults = [Faults(), Faults()]
    a, b = eps = endpoints(2, faults)
    try:
        configure(eps, 1)
        faults[1].delay(0.05)
        xs = [torch.ones(3000), torch.ones(3000)]
        ha, hb = a.allreduce(xs[0]), b.allreduce(xs[1])
        ha.wait(10.0)
        a.close()
        hb.wait(10.0)
        assert torch.equal(xs[1], torch.full((3000,), 2.0))
    finally:
        parallel(a.close, b.close)
