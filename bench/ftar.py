"""FTAR vs torch.distributed Gloo all-reduce, measured in the same run on the same data.

    python -m bench.ftar --world 2 4 --sizes 16MiB 64MiB 256MiB --json

Each point starts `world` processes on loopback. Every process builds one float32 tensor; FTAR
and Gloo iterations alternate (so background load hits both alike); before each, the tensor is
refilled (not timed) and all ranks pass a Gloo barrier; an iteration's time is the slowest rank's.
Reported: the median of --iters iterations after
--warmup ones, as bus bandwidth = bytes x 2(n-1)/n / time (GB/s, 1e9 bytes). `ratio` is Gloo's
median time over FTAR's; `paired_ratio` is the median of per-iteration ratios (each pair ran back to
back, so it is steadier when other processes load the machine). `results_match`: FTAR's sum equals
Gloo's (float32, to rounding). The ceiling is measured by the same processes in the same
alternation: a third contender per iteration, a plain TCP ring (each rank `sendall`s the bytes
FTAR sends per direction, 2(n-1)/n x size, to its right neighbour while it `recv_into`s as many
from its left, preallocated buffers, no reduce): at 2 ranks exactly bench.limits'
two-stream loopback. `tcp_busbw_gbs` is its bus bandwidth, `ftar_busbw_of_limit` FTAR's over it
(medians), `paired_of_limit` the median of per-iteration ratios.

One JSON line per point (FIELDS): world, bytes, ftar_busbw_gbs, gloo_busbw_gbs, ratio,
ftar_median_s, gloo_median_s, paired_ratio, tcp_busbw_gbs, ftar_busbw_of_limit, paired_of_limit,
iters, results_match, chunk_bytes, chunks_in_flight, load. A point that failed prints world,
bytes and `error` instead of the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta

from bench.common import free_port, load, parse_size

#: the fields of each JSON line (`python -m bench.ftar --json`) and their types
FIELDS = {"world": int, "bytes": int, "ftar_busbw_gbs": float, "gloo_busbw_gbs": float, "ratio": float,
          "ftar_median_s": float, "gloo_median_s": float, "paired_ratio": float, "tcp_busbw_gbs": float,
          "ftar_busbw_of_limit": float, "paired_of_limit": float, "iters": int, "results_match": bool,
          "chunk_bytes": int, "chunks_in_flight": int, "load": list[float]}


def _worker(rank, world, nbytes, iters, warmup, gloo_port, addr_q, members_q, out_q, chunk_bytes, chunks, sockbuf):
    try:
        _run_worker(rank, world, nbytes, iters, warmup, gloo_port, addr_q, members_q, out_q, chunk_bytes, chunks,
                    sockbuf)
    except BaseException as exc:  # the parent stops the point at once instead of waiting for a result
        out_q.put({"error": f"rank {rank}: {exc!r}"})
        raise


def _run_worker(rank, world, nbytes, iters, warmup, gloo_port, addr_q, members_q, out_q, chunk_bytes, chunks,
                sockbuf):
    import torch
    import torch.distributed as dist

    from ftar_kernels import FtarEndpoint, FtarSettings

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    settings = FtarSettings(chunk_bytes=chunk_bytes, chunks_in_flight=chunks, timeout_s=60.0, connect_timeout_s=30.0,
                            socket_buffer_bytes=sockbuf, auth_key=b"bench ftar key, the same on every rank")
    ep = FtarEndpoint("127.0.0.1", 0, settings)
    ceiling = socket.create_server(("127.0.0.1", 0))
    addr_q.put((rank, (ep.address, ceiling.getsockname()[1])))
    members = members_q.get()
    ep.configure("bench", 1, [a for a, _ in members])
    right = socket.create_connection(("127.0.0.1", members[(rank + 1) % world][1]))
    left, _ = ceiling.accept()
    per_direction = nbytes * 2 * (world - 1) // world
    out_buf, in_buf = memoryview(bytearray(per_direction)), memoryview(bytearray(per_direction))

    def tcp_ring() -> None:
        sender = threading.Thread(target=right.sendall, args=(out_buf,))
        sender.start()
        got = 0
        while got < per_direction:
            got += left.recv_into(in_buf[got:])
        sender.join()
    n = nbytes // 4
    src = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    buf = torch.empty_like(src)
    worst = torch.zeros(1, dtype=torch.float64)

    ftar_times: list[float] = []
    gloo_times: list[float] = []
    tcp_times: list[float] = []
    ftar_result = None
    # Interleave FTAR, Gloo and the TCP ceiling so that load from other processes hits all alike.
    for i in range(warmup + iters):
        for name, run, times in (("ftar", lambda: ep.allreduce(buf).wait(), ftar_times),
                                 ("gloo", lambda: dist.all_reduce(buf), gloo_times),
                                 ("tcp", tcp_ring, tcp_times)):
            buf.copy_(src)
            dist.barrier()
            t0 = time.perf_counter()
            run()
            worst[0] = time.perf_counter() - t0
            if name == "ftar" and ftar_result is None:
                ftar_result = buf.clone()
            if name == "gloo" and i == 0:
                gloo_result = buf.clone()
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times.append(float(worst[0]))
    ftar, gloo = ftar_times, gloo_times
    same = torch.allclose(ftar_result, gloo_result, rtol=1e-5, atol=1e-4)
    if rank == 0:
        out_q.put({"ftar": ftar, "gloo": gloo, "tcp": tcp_times, "same": bool(same)})
    right.close()
    left.close()
    ceiling.close()
    dist.barrier()
    ep.close()
    dist.destroy_process_group()


def measure(world: int, nbytes: int, iters: int, warmup: int, chunk_bytes: int, chunks: int,
            sockbuf: int, timeout_s: float = 600.0) -> dict:
    """One point; a worker's failure or the point taking longer than timeout_s ends it with an
    `error` row (the workers are stopped), never a hang."""
    ctx = mp.get_context("spawn")
    addr_q, out_q = ctx.Queue(), ctx.Queue()
    members_qs = [ctx.Queue() for _ in range(world)]
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, nbytes, iters, warmup, port, addr_q,
                                               members_qs[r], out_q, chunk_bytes, chunks, sockbuf))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        addrs = dict(addr_q.get(timeout=120) for _ in range(world))
        for q in members_qs:
            q.put([addrs[r] for r in range(world)])
        result = _result(out_q, procs, deadline)
    except (queue.Empty, RuntimeError) as exc:
        result = {"error": str(exc) or "a worker did not report its address"}
    finally:
        for p in procs:
            p.join(max(1.0, min(60.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    if "error" in result:
        return {"world": world, "bytes": nbytes, "error": result["error"], "chunk_bytes": chunk_bytes,
                "chunks_in_flight": chunks}
    factor = nbytes * 2 * (world - 1) / world / 1e9
    ftar_s, gloo_s = statistics.median(result["ftar"]), statistics.median(result["gloo"])
    tcp_s = statistics.median(result["tcp"])
    return {"world": world, "bytes": nbytes, "ftar_busbw_gbs": round(factor / ftar_s, 3),
            "gloo_busbw_gbs": round(factor / gloo_s, 3), "ratio": round(gloo_s / ftar_s, 3),
            "ftar_median_s": round(ftar_s, 4), "gloo_median_s": round(gloo_s, 4),
            "paired_ratio": round(statistics.median(g / f for f, g in zip(result["ftar"], result["gloo"])), 3),
            "tcp_busbw_gbs": round(factor / tcp_s, 3), "ftar_busbw_of_limit": round(tcp_s / ftar_s, 3),
            "paired_of_limit": round(statistics.median(t / f for f, t in zip(result["ftar"], result["tcp"])), 3),
            "iters": len(result["ftar"]), "results_match": result["same"],
            "chunk_bytes": chunk_bytes, "chunks_in_flight": chunks}


def _result(out_q, procs, deadline: float) -> dict:
    """Rank 0's result, or the first error a worker reported; RuntimeError when a worker died
    without a word or the deadline passed."""
    while True:
        try:
            return out_q.get(timeout=1.0)
        except queue.Empty:
            pass
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"a worker exited with {dead[0]} before the point was measured")
        if time.monotonic() > deadline:
            raise RuntimeError("the point did not finish within its timeout")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["16MiB", "64MiB", "256MiB"])
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunk-bytes", default="8MiB")
    ap.add_argument("--chunks-in-flight", type=int, default=2)
    ap.add_argument("--socket-buffer-bytes", default="0", help="SO_SNDBUF/SO_RCVBUF; 0 (FTAR's default) keeps "
                    "kernel autotuning")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="bound on one point (an error row past it)")
    ap.add_argument("--json", action="store_true", help="one JSON line per point")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for world in args.world:
        for size in args.sizes:
            row = measure(world, parse_size(size), args.iters, args.warmup,
                          parse_size(args.chunk_bytes), args.chunks_in_flight,
                          parse_size(args.socket_buffer_bytes), args.timeout_s)
            row["load"] = load()
            if args.json:
                print(json.dumps(row), flush=True)
            elif "error" in row:
                print(f"world {world} {size:>8}: {row['error']}", flush=True)
            else:
                print(f"world {world} {size:>8}: FTAR {row['ftar_busbw_gbs']:.2f} GB/s, "
                      f"Gloo {row['gloo_busbw_gbs']:.2f} GB/s, ratio {row['ratio']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
