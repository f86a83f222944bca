"""The CUDA path of FTAR: correct against torch, and how fast it is (needs a GPU and CuPy).

    python -m bench.ftar_gpu --json

1. Kernel: the CuPy reduce kernel (dst on the GPU += pinned host src) for every dtype and for grids
   of (blocks x threads), checked against torch and timed (GB/s of dst bytes).
2. All-reduce: `--world` endpoints in this process (threads, loopback TCP, one GPU), CUDA tensors of
   --sizes, checked against the torch sum and timed (bus bandwidth, as in bench.ftar).
Prints one JSON line per measurement. Exits 0 with a message when no GPU is present.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time


def parse_size(text: str) -> int:
    for unit, factor in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def bench_kernel(torch, dtype, blocks: int, threads: int, nbytes: int, iters: int) -> dict:
    from ftar_kernels.cuda_kernels import ReduceKernels

    stream = torch.cuda.Stream()
    kernels = ReduceKernels(str(dtype).removeprefix("torch."), blocks, threads, stream.cuda_stream,
                            torch.cuda.current_device())
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    dst = torch.randint(-20, 21, (n,), device="cuda").to(dtype)
    src = torch.randint(-20, 21, (n,)).to(dtype).pin_memory()
    want = (dst.float() + src.cuda().float()).to(dtype)
    torch.cuda.synchronize()
    kernels.add(dst.data_ptr(), src.data_ptr(), nbytes, dst.element_size())
    stream.synchronize()
    correct = bool(torch.equal(dst, want))
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        kernels.add(dst.data_ptr(), src.data_ptr(), nbytes, dst.element_size())
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    t = statistics.median(times)
    return {"what": "kernel", "dtype": str(dtype), "blocks": blocks, "threads": threads, "bytes": nbytes,
            "correct": correct, "gbs": round(nbytes / t / 1e9, 2)}


def bench_allreduce(torch, world: int, nbytes: int, iters: int, dtype, settings) -> dict:
    from ftar_kernels import FtarEndpoint

    eps = [FtarEndpoint("127.0.0.1", 0, settings) for _ in range(world)]
    members = [e.address for e in eps]
    threads = [threading.Thread(target=e.configure, args=("gpu", 1, members)) for e in eps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    srcs = [torch.randint(-8, 9, (n,), device="cuda").to(dtype) for _ in eps]
    want = sum(s.double() for s in srcs).to(dtype)
    bufs = [s.clone() for s in srcs]
    times, correct = [], True
    for i in range(iters + 1):
        for b, s in zip(bufs, srcs):
            b.copy_(s)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for h in [e.allreduce(b) for e, b in zip(eps, bufs)]:
            h.wait(120.0)
        if i:
            times.append(time.perf_counter() - t0)
        correct = correct and all(torch.equal(b, want) for b in bufs)
    for e in eps:
        e.close()
    t = statistics.median(times)
    return {"what": "allreduce", "world": world, "dtype": str(dtype), "bytes": nbytes, "correct": correct,
            "busbw_gbs": round(nbytes * 2 * (world - 1) / world / t / 1e9, 3), "median_s": round(t, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["16MiB", "64MiB"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--kernel-bytes", default="64MiB")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    from ftar_kernels import FtarSettings

    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    rows = [bench_kernel(torch, d, b, t, parse_size(args.kernel_bytes), args.iters)
            for d in dtypes for b, t in ((2, 512), (8, 512), (32, 512))]
    settings = FtarSettings(timeout_s=60.0, auth_key=os.urandom(32))
    rows += [bench_allreduce(torch, w, parse_size(s), args.iters, d, settings)
             for w in args.world for s in args.sizes for d in (torch.float32, torch.bfloat16)]
    ok = True
    for row in rows:
        ok = ok and row["correct"]
        print(json.dumps(row) if args.json else row, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
