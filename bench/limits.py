"""The data plane's ceilings on this machine: what loopback TCP, memcpy and torch's add_ move.

    python -m bench.limits --json

- `tcp_one_stream_gbs`: one loopback TCP connection, `sendall` from and `recv_into` a
  preallocated buffer, --total bytes (1 GiB) -- the ceiling of one catch-up stream.
- `tcp_one_stream_mem_gbs`: the same from a --total buffer into another (each byte read from and
  written to memory once, as a catch-up does; the 4 MiB buffers above stay in cache):
  informative, no benchmark's `_of_limit` uses it.
- `tcp_two_stream_gbs`: two connections at once in opposite directions (what a 2-rank ring
  does), GB/s per direction -- the ceiling of FTAR's bus bandwidth at 2 ranks.
- `tcp_one_stream_woken_gbs`, `tcp_two_stream_woken_gbs`: the same two, the receiver woken once
  512 KiB is queued instead of at each arrival (`ftar_kernels.woken_receive`, as FTAR and the
  catch-up fetcher receive): informative, what this machine's loopback moves when the receiving
  thread is not woken for every 64 KiB; no `_of_limit` uses them (the issue's ceilings stay as
  defined, so rounds stay comparable).
- `memcpy_gbs`: torch copy_ between two 256 MiB tensors (bytes copied per second).
- `add_gbs`: torch add_ of a chunk-sized float32 staging tensor into a large destination,
  chunk by chunk (bytes of destination reduced per second), at --chunk-bytes (FTAR's chunk).

Each socket figure is the best of --repeats runs (the machine is shared: the best run is the
one least disturbed). Every data-plane benchmark measures the ceiling it is compared with in
its own run (`measure_tcp`), and prints its figure as a fraction of it (`*_of_limit`).
GB/s are 1e9 bytes per second. One JSON line (FIELDS): the seven figures above, add_chunk_bytes,
bytes_per_stream, cpus, load.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

from bench.common import load, parse_size
from ftar_kernels.woken_receive import WokenReceiver

GB = 1e9
BUFFER_BYTES = 4 << 20
#: the fields of the JSON line (`python -m bench.limits --json`) and their types
FIELDS = {"tcp_one_stream_gbs": float, "tcp_one_stream_mem_gbs": float, "tcp_two_stream_gbs": float,
          "tcp_one_stream_woken_gbs": float, "tcp_two_stream_woken_gbs": float, "memcpy_gbs": float, "add_gbs": float,
          "add_chunk_bytes": int, "bytes_per_stream": int, "cpus": int, "load": list[float]}


def _send(sock: socket.socket, total: int, buf: memoryview) -> None:
    """`total` bytes from `buf`, walked through (and again from its start while bytes are left)
    in calls of at most BUFFER_BYTES."""
    left, off = total, 0
    while left:
        n = min(left, BUFFER_BYTES, len(buf) - off)
        sock.sendall(buf[off:off + n])
        left -= n
        off = (off + n) % len(buf)


def _recv(sock: socket.socket, total: int, buf: memoryview, woken: bool = False) -> None:
    receiver = WokenReceiver(sock) if woken else None
    left, off = total, 0
    while left:
        n = min(left, BUFFER_BYTES, len(buf) - off)
        k = receiver.receive(buf[off:off + n], left, 60.0) if receiver else sock.recv_into(buf[off:], n)
        if not k:
            raise ConnectionError("loopback peer closed early")
        left -= k
        off = (off + k) % len(buf)


def _side(side: int, streams: int, total: int, buffer_bytes: int, woken: bool, ports, start, out) -> None:
    """One endpoint process (spawned, so it shares no memory with the caller's): side 0 listens
    and sends on even streams, side 1 dials and sends on odd ones (alternating directions, as
    the two ranks of a ring), a thread per connection, timed from a shared start."""
    if side == 0:
        listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(streams)]
        ports.put([s.getsockname()[1] for s in listeners])
        socks = [s.accept()[0] for s in listeners]
        for s in listeners:
            s.close()
    else:
        socks = [socket.create_connection(("127.0.0.1", port)) for port in ports.get(timeout=60)]
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threads = [threading.Thread(target=_send, args=(s, total, memoryview(bytearray(buffer_bytes)))) if i % 2 == side
               else threading.Thread(target=_recv, args=(s, total, memoryview(bytearray(buffer_bytes)), woken))
               for i, s in enumerate(socks)]
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(time.perf_counter() - t0)
    for s in socks:
        s.close()


def _streams_once(streams: int, total: int, buffer_bytes: int, woken: bool = False) -> float:
    """Seconds for `streams` connections between two processes (alternating directions, as the
    two ranks of a ring, each with a thread per connection) to move `total` bytes each. The
    processes are spawned, not forked: a fork would leave the caller's memory copy-on-write,
    and the caller's next writes into it (a catch-up into its tensors) would fault page by page."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    ports, start, out = ctx.Queue(), ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_side, args=(side, streams, total, buffer_bytes, woken, ports, start, out))
             for side in (0, 1)]
    try:
        for p in procs:
            p.start()
        start.wait(timeout=120)
        return max(out.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def measure_tcp(streams: int, total: int = 1 << 30, repeats: int = 3, buffer_bytes: int = BUFFER_BYTES,
                woken: bool = False) -> float:
    """GB/s per stream: the best of `repeats` runs of `streams` loopback connections at once,
    each end reusing a `buffer_bytes` buffer (buffer_bytes = total: memory to memory); `woken`:
    the receivers wait in `WokenReceiver` (woken once 512 KiB is queued)."""
    return max(total / _streams_once(streams, total, buffer_bytes, woken) / GB for _ in range(repeats))


def measure_memcpy(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    import torch
    a, b = torch.empty(nbytes, dtype=torch.uint8), torch.ones(nbytes, dtype=torch.uint8)
    a.copy_(b)
    best = min(_timed(lambda: a.copy_(b)) for _ in range(repeats))
    return nbytes / best / GB


def measure_add(chunk_bytes: int, total: int = 256 << 20, repeats: int = 5) -> float:
    import torch
    n, c = total // 4, chunk_bytes // 4
    dst, staging = torch.ones(n), torch.ones(c)

    def run() -> None:
        for lo in range(0, n, c):
            hi = min(n, lo + c)
            dst[lo:hi].add_(staging[:hi - lo])
    run()
    return total / min(_timed(run) for _ in range(repeats)) / GB


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", default="1GiB", help="bytes per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-bytes", default="", help="the add_ chunk (default: FTAR's chunk_bytes)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from ftar_kernels import FtarSettings
    total = parse_size(args.total)
    chunk = parse_size(args.chunk_bytes) if args.chunk_bytes else FtarSettings().chunk_bytes
    row = {"tcp_one_stream_gbs": round(measure_tcp(1, total, args.repeats), 3),
           "tcp_one_stream_mem_gbs": round(measure_tcp(1, total, args.repeats, total), 3),
           "tcp_two_stream_gbs": round(measure_tcp(2, total, args.repeats), 3),
           "tcp_one_stream_woken_gbs": round(measure_tcp(1, total, args.repeats, woken=True), 3),
           "tcp_two_stream_woken_gbs": round(measure_tcp(2, total, args.repeats, woken=True), 3),
           "memcpy_gbs": round(measure_memcpy(), 3),
           "add_gbs": round(measure_add(chunk), 3), "add_chunk_bytes": chunk,
           "bytes_per_stream": total, "cpus": os.cpu_count(), "load": load()}
    if args.json:
        print(json.dumps(row), flush=True)
    else:
        print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
