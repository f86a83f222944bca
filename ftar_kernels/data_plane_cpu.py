"""Data plane for CPU tensors: torch adds, zero-copy socket views.

Sends read straight from the tensor's memory; all-gather receives land straight in the tensor,
so copying costs nothing. A reduce-scatter chunk is received piece by piece into one reused
staging buffer (`FtarSettings.cpu_fold_bytes`), and each piece is added into the tensor as soon
as it is in: the piece is still in the core's cache when add_ reads it, and the receiving thread
folds while the sending thread goes on sending (torch's add_ releases the GIL). 16-bit types
are added in float32 and rounded back, one rounding per hop, whatever the piece size.
"""

from __future__ import annotations

from typing import Iterator

import torch


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a contiguous CPU tensor's bytes (no copy)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


class CpuDataPlane:
    def __init__(self, chunk_bytes: int, fold_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.fold_bytes = min(chunk_bytes, fold_bytes)
        self._staging = torch.empty(self.fold_bytes, dtype=torch.uint8)
        self._staging_bytes = byte_view(self._staging)
        self._flat: torch.Tensor | None = None
        self._bytes: memoryview | None = None
        self._es = 1

    def register(self, conn) -> None:
        conn.register(self._staging_bytes)

    def begin(self, flat: torch.Tensor) -> None:
        self._flat = flat
        self._es = flat.element_size()
        self._bytes = byte_view(flat)

    def send_view(self, k: int, lo: int, hi: int) -> memoryview:
        return self._bytes[lo * self._es:hi * self._es]

    def sent(self, k: int) -> None:
        """The bytes from send_view(k, ...) left; nothing to release on CPU."""

    def pieces(self, lo: int, hi: int, reduce: bool) -> Iterator[tuple[int, int]]:
        """How chunk [lo, hi) is received: reduce-scatter in pieces of the staging buffer's size,
        all-gather in one (straight into the tensor)."""
        if not reduce:
            yield lo, hi
            return
        step = self.fold_bytes // self._es
        for a in range(lo, hi, step):
            yield a, min(hi, a + step)

    def recv_view(self, k: int, lo: int, hi: int, reduce: bool) -> memoryview:
        if reduce:
            return self._staging_bytes[:(hi - lo) * self._es]
        return self._bytes[lo * self._es:hi * self._es]

    def received(self, k: int, lo: int, hi: int, reduce: bool) -> None:
        """Fold the bytes just received by recv_view(k, lo, hi, ...) into the tensor."""
        if reduce:
            staged = self._staging[:(hi - lo) * self._es]
            self._flat[lo:hi].add_(staged.view(self._flat.dtype))

    def finish(self) -> None:
        self._flat = None
        self._bytes = None
