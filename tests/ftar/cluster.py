"""Real FTAR peers in separate processes (forked by a multiprocessing fork server), driven over pipes by the test process.

Each worker owns one FtarEndpoint (behind a FaultyTransport) and runs commands one at a time:
configure, allreduce (inputs made from a seed, so the test can compute the expected sum), delay,
counts, and what the security tests inspect (parked hellos, pending hellos, threads). `Cluster` starts them, fans a command out to several and gathers the answers, each wait
bounded.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass

from tests import forked

DTYPES = ("float32", "bfloat16", "float16")
#: the job's key every test endpoint holds (FTAR authenticates every hello)
KEY = bytes(range(32))


def make_input(numel: int, dtype: str, seed: int, position: int):
    """Small integers, so every partial sum is exact in every dtype and the order cannot matter."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1009 + position)
    return torch.randint(-20, 21, (numel,), generator=gen).to(getattr(torch, dtype))


def expected_sum(numel: int, dtype: str, seed: int, positions: int):
    import torch

    total = sum(make_input(numel, dtype, seed, p).to(torch.float64) for p in range(positions))
    return total.to(getattr(torch, dtype))


def tensor_bytes(t) -> bytes:
    import torch

    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _worker(conn, settings_kwargs: dict) -> None:
    import torch

    from ftar_kernels import Faults, FaultyTransport, FtarEndpoint, FtarError, FtarSettings, TcpTransport

    torch.set_num_threads(1)
    faults = Faults()
    ep = FtarEndpoint("127.0.0.1", 0, FtarSettings(**{"auth_key": KEY, **settings_kwargs}),
                      transport=FaultyTransport(TcpTransport(), faults))
    conn.send(ep.address)

    def allreduce(numel, dtype, seed, position, wait_s):
        x = make_input(numel, dtype, seed, position)
        handle = ep.allreduce(x)
        conn.send(("started", None))
        stats = handle.wait(wait_s)
        data = tensor_bytes(x)
        return {"sha": hashlib.sha256(data).hexdigest(), "data": data, "bytes": stats.bytes}

    handlers = {
        "configure": lambda group, gen, members: ep.configure(group, gen, members),
        "allreduce": allreduce,
        "delay": lambda seconds: faults.delay(seconds),
        "state": lambda: ep.state.value,
        "close": lambda: ep.close(),
        # what the security tests look at: parked identities, hellos being read, threads
        "parked": lambda: sorted([list(k) for k in ep._membership._parked]),
        "pending": lambda: ep._membership.pending_hellos,
        "threads": lambda: threading.active_count(),
    }
    while True:
        cmd, args = conn.recv()
        if cmd == "exit":
            ep.close()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", handlers[cmd](*args)))
        except FtarError as exc:
            conn.send(("err", (type(exc).__name__, str(exc))))


@dataclass
class Answer:
    ok: bool
    value: object  # the result, or (error class name, message)


class Cluster:
    def __init__(self, size: int, **settings_kwargs) -> None:
        ctx = forked.context()  # the fork server imports torch once; every worker starts in milliseconds
        self._conns, self.procs = [], []
        for _ in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, settings_kwargs), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self.procs.append(proc)
        self.addresses = [self._recv(i, 60.0) for i in range(size)]

    def _recv(self, i: int, timeout_s: float):
        if not self._conns[i].poll(timeout_s):
            raise TimeoutError(f"worker {i} did not answer within {timeout_s} s")
        return self._conns[i].recv()

    def send(self, i: int, cmd: str, *args) -> None:
        self._conns[i].send((cmd, args))

    def answer(self, i: int, timeout_s: float = 30.0) -> Answer:
        while True:
            kind, value = self._recv(i, timeout_s)
            if kind != "started":
                return Answer(kind == "ok", value)

    def wait_started(self, i: int, timeout_s: float = 30.0) -> None:
        kind, value = self._recv(i, timeout_s)
        assert kind == "started", (kind, value)

    def run(self, workers: list[int], cmd: str, *args_per_worker, timeout_s: float = 30.0) -> list[Answer]:
        """Send cmd to every worker (args_per_worker[j] is the j-th worker's args) and gather."""
        for j, i in enumerate(workers):
            self.send(i, cmd, *args_per_worker[j])
        return [self.answer(i, timeout_s) for i in workers]

    def configure(self, workers: list[int], group: str, generation: int) -> list[Answer]:
        members = [self.addresses[i] for i in workers]
        return self.run(workers, "configure", *[(group, generation, members)] * len(workers))

    def allreduce(self, workers, numel, dtype, seed, wait_s=20.0, numels=None) -> list[Answer]:
        args = [((numels or {}).get(i, numel), dtype, seed, pos, wait_s) for pos, i in enumerate(workers)]
        return self.run(workers, "allreduce", *args, timeout_s=wait_s + 10)

    def kill(self, i: int) -> None:
        os.kill(self.procs[i].pid, 9)
        self.procs[i].join(10)

    def close(self) -> None:
        alive = [i for i, proc in enumerate(self.procs) if proc.is_alive()]
        for i in alive:
            try:
                self.send(i, "exit")
            except OSError:
                pass
        for i in alive:
            try:
                self._recv(i, 10.0)
            except (OSError, EOFError, TimeoutError):
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self._conns:
            conn.close()


def parallel(*calls) -> list:
    """Run zero-argument callables in threads (in-process endpoints), return their results."""
    results: list = [None] * len(calls)

    def run(k, fn):
        try:
            results[k] = fn()
        except BaseException as exc:  # noqa: BLE001
            results[k] = exc

    threads = [threading.Thread(target=run, args=(k, fn)) for k, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results
