"""The CUDA path of FTAR: correct against torch, and how fast it is (needs a GPU and CuPy).

    python -m bench.ftar_gpu --json

1. Kernel: the CuPy reduce kernel (dst on the GPU += pinned host src) for every dtype and for grids
   of (blocks x threads), checked against torch and timed (GB/s of dst bytes).
2. All-reduce: `--world` endpoints in this process (threads, loopback TCP, one GPU), CUDA tensors of
   --sizes, checked against the torch sum and timed (bus bandwidth, as in bench.ftar).
3. Runtime: CUDA tensors end to end through the trainer runtime: a controller and 2 replica
   processes sharing the GPU, each a transformer (fthsdp/demo/gpt.py, --runtime-layers x
   --runtime-d-model) wrapped with FSDP2 over NCCL; every group's gradient shard crosses
   replicas from FSDP's all-reduce hook over FTAR (CuPy kernel, pinned staging) and the
   optimizer steps on the device. One line per dtype: median step time (the slower replica),
   gradient bytes FTAR moved per step and replica, and whether both replicas ended bitwise equal.
Prints one JSON line per measurement (FIELDS: what, dtype, correct; then each measurement's own
figures). Without a CUDA device or CuPy it measures nothing: it says why on stderr and exits
with NO_DEVICE (3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import free_port, parse_size, secret_file

#: the fields every JSON line (`python -m bench.ftar_gpu --json`) carries, and their types
FIELDS = {"what": str, "dtype": str, "correct": bool}
#: the exit status without a CUDA device or CuPy: nothing was measured
NO_DEVICE = 3


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


def _runtime_worker(args) -> None:
    """One replica of one rank on GPU 0 (see the module docstring, part 3); prints one JSON line."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, state_digest
    from fthsdp.demo.gpt import Corpus, GptConfig, TinyGPT, parameter_count, shard
    from protos import job_secret

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=0, world_size=1)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = TinyGPT(GptConfig(layers=args.runtime_layers, d_model=args.runtime_d_model, heads=8, seq_len=128))
    n_params = parameter_count(model)
    shard(model.to("cuda", dtype), init_device_mesh("cuda", (1,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    manager = Manager(model, opt, RuntimeSettings(
        job_id="gpu-bench", replica_id=args.replica, controller_address=args.controller, apply_lr_scale=False,
        allreduce_timeout_s=120.0, gather_timeout_s=120.0, quorum_timeout_s=120.0, job_secret=job_secret.from_env()), process_group=dist.group.WORLD).start()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    corpus = Corpus.load()
    batches = manager.batches(lambda replica, position: corpus.batch(int(replica), position, 8, 128, 0))
    times = []
    for i in range(args.iters + 2):
        x, y = next(batches)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ft_opt.zero_grad()
        loss = model.loss(x.cuda(), y.cuda())
        loss.backward()
        if not ft_opt.step(loss):
            raise RuntimeError(f"step failed without injected faults: {manager.last_outcome}")
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    digest = state_digest(model, opt, manager.ledger.to_json(), manager.step)
    manager.close()
    dist.destroy_process_group()
    print(json.dumps({"times": times, "digest": digest, "params": n_params}), flush=True)


def bench_runtime(dtype: str, args) -> dict:
    import os
    import subprocess

    from controller.launch import launch
    from protos import job_secret

    repo = Path(__file__).resolve().parents[1]
    # the replicas' ports authenticate as in production, with one secret for this run
    text = job_secret.generate()
    env = {**os.environ, "PYTHONPATH": str(repo), job_secret.ENV_JOB_SECRET: text}
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-gpu-") as tmp:
        ctl = launch("--replicas", "2", "--min-replicas", "2", "--join-timeout-s", "60", "--job-id", "gpu-bench",
                     "--job-secret-file", str(secret_file(tmp, text)), env=env, cwd=str(repo))
    try:
        flags = ["--iters", str(args.iters), "--runtime-layers", str(args.runtime_layers),
                 "--runtime-d-model", str(args.runtime_d_model), "--dtype", dtype, "--controller", ctl.grpc]
        workers = [subprocess.Popen([sys.executable, "-m", "bench.ftar_gpu", "--role", "runtime-worker",
                                     "--replica", str(r), "--port", str(free_port()), *flags], stdout=subprocess.PIPE,
                                    text=True, env=env, cwd=repo) for r in range(2)]
        results = [json.loads(w.communicate(timeout=900)[0].strip().splitlines()[-1]) for w in workers]
    finally:
        ctl.stop()
    step = statistics.median(max(v) for v in zip(*(r["times"] for r in results)))
    return {"what": "runtime", "replicas": 2, "dtype": dtype, "params": results[0]["params"],
            "grad_bytes_per_step": results[0]["params"] * 4,  # 16-bit shards travel as float32
            "step_ms": round(step * 1e3, 2), "correct": results[0]["digest"] == results[1]["digest"]}


def _no_device(torch) -> str:
    """Why the CUDA path cannot run here ("" when it can)."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install 'fthsdp[cuda]')"
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["16MiB", "64MiB"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--kernel-bytes", default="64MiB")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runtime-layers", type=int, default=12)
    ap.add_argument("--runtime-d-model", type=int, default=768)
    ap.add_argument("--role", choices=["main", "runtime-worker"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--replica", default="0", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--controller", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "runtime-worker":
        _runtime_worker(args)
        return 0
    import torch

    why = _no_device(torch)
    if why:
        print(f"bench.ftar_gpu: {why}: nothing measured (this benchmark is the CUDA path of FTAR only; "
              f"bench.ftar measures it on CPUs)", file=sys.stderr)
        return NO_DEVICE
    from ftar_kernels import FtarSettings

    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    rows = [bench_kernel(torch, d, b, t, parse_size(args.kernel_bytes), args.iters)
            for d in dtypes for b, t in ((2, 512), (8, 512), (32, 512))]
    settings = FtarSettings(timeout_s=60.0, auth_key=os.urandom(32))
    rows += [bench_allreduce(torch, w, parse_size(s), args.iters, d, settings)
             for w in args.world for s in args.sizes for d in (torch.float32, torch.bfloat16)]
    rows += [bench_runtime(d, args) for d in ("float32", "bfloat16")]
    ok = True
    for row in rows:
        ok = ok and row["correct"]
        print(json.dumps(row) if args.json else row, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
