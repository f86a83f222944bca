"""Data plane for CPU tensors: torch adds and copies, zero-copy socket views.

Sends read straight from the tensor's memory; reduce-scatter receives land in one of C
preallocated staging buffers and are added in place (torch's add_ releases the GIL; 16-bit types
are added in float32 and rounded back, one rounding per hop); all-gather receives land straight in
the tensor, so copying costs nothing.
"""

from __future__ import annotations

import torch


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a contiguous CPU tensor's bytes (no copy)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


class CpuDataPlane:
    def __init__(self, chunk_bytes: int, chunks: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._slots = [torch.empty(chunk_bytes, dtype=torch.uint8) for _ in range(chunks)]
        self._slot_bytes = [byte_view(s) for s in self._slots]
        self._flat: torch.Tensor | None = None
        self._bytes: memoryview | None = None
        self._es = 1

    def register(self, conn) -> None:
        for view in self._slot_bytes:
            conn.register(view)

    def begin(self, flat: torch.Tensor) -> None:
        self._flat = flat
        self._es = flat.element_size()
        self._bytes = byte_view(flat)

    def send_view(self, k: int, lo: int, hi: int) -> memoryview:
        return self._bytes[lo * self._es:hi * self._es]

    def sent(self, k: int) -> None:
        """The bytes from send_view(k, ...) left; nothing to release on CPU."""

    def recv_view(self, k: int, lo: int, hi: int, reduce: bool) -> memoryview:
        if reduce:
            return self._slot_bytes[k % len(self._slots)][:(hi - lo) * self._es]
        return self._bytes[lo * self._es:hi * self._es]

    def received(self, k: int, lo: int, hi: int, reduce: bool) -> None:
        """Fold the bytes received by recv_view(k, ...) into the tensor."""
        if reduce:
            slot = self._slots[k % len(self._slots)][:(hi - lo) * self._es]
            self._flat[lo:hi].add_(slot.view(self._flat.dtype))

    def finish(self) -> None:
        self._flat = None
        self._bytes = None
