"""Data plane for CUDA tensors: pinned host staging, CuPy reduce kernel, one private stream.

Receives land in C pinned staging buffers per peer; the reduce kernel reads them directly and adds
into the tensor (reduce-scatter) or an async copy moves them in (all-gather). Sends copy device
bytes into one of C pinned send buffers first. Everything runs on one stream, so a send copy is
ordered after every reduce enqueued before it (the ring's step dependency). A pinned buffer is
reused only after the event recorded when it was last consumed has completed.
CuPy and the kernels load only when a CUDA tensor is all-reduced.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .cuda_kernels import ReduceKernels
from .data_plane_cpu import byte_view


class CudaDataPlane:
    def __init__(self, chunk_bytes: int, chunks: int, device: torch.device, blocks: int, threads: int) -> None:
        self.device = device
        self.chunk_bytes = chunk_bytes
        self._recv = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(chunks)]
        self._send = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(chunks)]
        self._recv_views = [byte_view(t) for t in self._recv]
        self._send_views = [byte_view(t) for t in self._send]
        self._recv_done = [torch.cuda.Event() for _ in range(chunks)]
        self._recv_used = [False] * chunks
        self._send_done = [torch.cuda.Event() for _ in range(chunks)]
        self.stream = torch.cuda.Stream(device=device)
        self._blocks, self._threads = blocks, threads
        self._kernels: dict[torch.dtype, ReduceKernels] = {}
        self._flat: torch.Tensor | None = None
        self._flat_bytes: torch.Tensor | None = None
        self._es = 1

    def register(self, conn) -> None:
        for view in self._recv_views + self._send_views:
            conn.register(view)

    def begin(self, flat: torch.Tensor, ready: torch.cuda.Event | None = None) -> None:
        if ready is not None:
            self.stream.wait_event(ready)  # the caller's producer kernels come first
        self._flat = flat
        self._flat_bytes = flat.view(torch.uint8)
        self._es = flat.element_size()
        if flat.dtype not in self._kernels:
            name = str(flat.dtype).removeprefix("torch.")
            self._kernels[flat.dtype] = ReduceKernels(
                name, self._blocks, self._threads, self.stream.cuda_stream, self.device.index or 0)

    def send_view(self, k: int, lo: int, hi: int) -> memoryview:
        i, nb = k % len(self._send), (hi - lo) * self._es
        with torch.cuda.stream(self.stream):
            self._send[i][:nb].copy_(self._flat_bytes[lo * self._es:hi * self._es], non_blocking=True)
            self._send_done[i].record(self.stream)
        self._send_done[i].synchronize()
        return self._send_views[i][:nb]

    def sent(self, k: int) -> None:
        """send_all has returned, so the pinned send buffer is free again."""

    def pieces(self, lo: int, hi: int, reduce: bool) -> Iterator[tuple[int, int]]:
        """A chunk is received whole into one pinned buffer (one kernel or copy per chunk)."""
        yield lo, hi

    def recv_view(self, k: int, lo: int, hi: int, reduce: bool) -> memoryview:
        i = k % len(self._recv)
        if self._recv_used[i]:
            self._recv_done[i].synchronize()  # the GPU has finished reading this buffer
        return self._recv_views[i][:(hi - lo) * self._es]

    def received(self, k: int, lo: int, hi: int, reduce: bool) -> None:
        i, nb = k % len(self._recv), (hi - lo) * self._es
        dst = self._flat_bytes[lo * self._es:hi * self._es]
        if reduce:
            self._kernels[self._flat.dtype].add(dst.data_ptr(), self._recv[i].data_ptr(), nb, self._es)
        else:
            with torch.cuda.stream(self.stream):
                dst.copy_(self._recv[i][:nb], non_blocking=True)
        self._recv_done[i].record(self.stream)
        self._recv_used[i] = True

    def finish(self) -> None:
        self.stream.synchronize()
        self._recv_used = [False] * len(self._recv)
        self._flat = self._flat_bytes = None
