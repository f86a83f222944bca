"""The byte layout of a replica's live state, for catch-up transfers (no sockets here).

A transfer body is:
    8-byte big-endian manifest length | manifest JSON | every tensor's raw bytes in
    manifest order | 4-byte big-endian checksum of everything before it.
The checksum is CRC-32 over the header and manifest, continued over a digest of each
8 MiB piece of every tensor: the piece's length and two 64-bit sums of its 8-byte words,
plain and position-weighted (Fletcher-style; numpy computes them at memory speed, several
times faster than CRC-32, and they catch flipped, dropped, swapped or shifted words).
The manifest names each tensor (`model/<key>` or `optim/<param index>/<key>`) with its
dtype, shape and byte count, and carries the small non-tensor state: the step, the
data ledger, and the optimizer's non-tensor per-parameter values. Tensors are read
from and written into CPU memory in place, so the state is never held twice.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

PIECE_BYTES = 8 << 20
HEADER = struct.Struct(">Q")
TRAILER = struct.Struct(">I")
MAX_MANIFEST_BYTES = 256 << 20


class TransferError(Exception):
    """A state transfer was cut short, malformed or failed its checksum: fetch again."""


_WEIGHTS: np.ndarray | None = None
_PIECE_DIGEST = struct.Struct("<QQQ")


class StreamChecksum:
    """The transfer checksum (see the module docstring). Feed tensor bytes in PIECE_BYTES pieces."""

    def __init__(self) -> None:
        global _WEIGHTS
        if _WEIGHTS is None:
            _WEIGHTS = np.arange(1, PIECE_BYTES // 8 + 2, dtype=np.uint64)
        self.value = 0
        self._scratch = np.empty(PIECE_BYTES // 8 + 1, dtype=np.uint64)

    def update_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Small control data (header, manifest): plain CRC-32."""
        self.value = zlib.crc32(data, self.value)

    def update_piece(self, piece: memoryview) -> None:
        n = len(piece)
        if n > PIECE_BYTES:
            raise ValueError(f"pieces are at most {PIECE_BYTES} bytes, got {n}")
        k = n // 8
        words = np.frombuffer(piece, dtype=np.uint64, count=k)
        if n % 8:
            tail = np.frombuffer(bytes(piece[k * 8:]).ljust(8, b"\0"), dtype=np.uint64)
            words = np.concatenate([words, tail])
        plain = int(np.add.reduce(words, dtype=np.uint64))
        weighted = np.multiply(words, _WEIGHTS[:len(words)], out=self._scratch[:len(words)])
        self.value = zlib.crc32(_PIECE_DIGEST.pack(plain, int(np.add.reduce(weighted, dtype=np.uint64)), n),
                                self.value)


class PipelinedChecksum:
    """Digests pieces on one helper thread (numpy releases the GIL), in order, so that
    hashing piece i overlaps the socket I/O of piece i+1. Use as a context manager."""

    def __init__(self) -> None:
        self.checksum = StreamChecksum()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-checksum")
        self._pending: list[Future] = []

    def __enter__(self) -> "PipelinedChecksum":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def update_bytes(self, data: bytes | bytearray | memoryview) -> None:
        self._pending.append(self._pool.submit(self.checksum.update_bytes, bytes(data)))

    def update_piece(self, piece: memoryview) -> None:
        keep = []
        for f in self._pending:
            if f.done():
                f.result()  # surface a failed digest early
            else:
                keep.append(f)
        self._pending = keep
        self._pending.append(self._pool.submit(self.checksum.update_piece, piece))

    def value(self) -> int:
        for f in self._pending:
            f.result()
        self._pending.clear()
        return self.checksum.value


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    step: int
    ledger_json: str
    optim_scalars: dict[str, dict[str, Any]]
    entries: tuple[Entry, ...]

    def to_bytes(self) -> bytes:
        body = json.dumps({
            "step": self.step, "ledger": self.ledger_json, "optim_scalars": self.optim_scalars,
            "entries": [[e.name, e.dtype, list(e.shape), e.nbytes] for e in self.entries],
        }).encode()
        return HEADER.pack(len(body)) + body

    @classmethod
    def from_json(cls, body: bytes) -> "Manifest":
        try:
            raw = json.loads(body)
            entries = tuple(Entry(n, d, tuple(s), b) for n, d, s, b in raw["entries"])
            return cls(int(raw["step"]), str(raw["ledger"]), dict(raw["optim_scalars"]), entries)
        except (ValueError, KeyError, TypeError) as exc:
            raise TransferError(f"malformed state manifest: {exc}") from exc

    @property
    def total_bytes(self) -> int:
        return len(self.to_bytes()) + sum(e.nbytes for e in self.entries) + TRAILER.size


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor (no copy)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"state tensors must be contiguous CPU tensors, got device={t.device} "
                         f"contiguous={t.is_contiguous()}")
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def live_entries(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                 ) -> tuple[list[tuple[str, torch.Tensor]], dict[str, dict[str, Any]]]:
    """(name, tensor) for every model and optimizer tensor (views of live memory), and the
    optimizer's non-tensor per-parameter values."""
    entries = [(f"model/{k}", v) for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)]
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(per_param.items()):
            if isinstance(value, torch.Tensor):
                entries.append((f"optim/{idx}/{key}", value))
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return entries, scalars


def build_manifest(step: int, ledger_json: str, entries: list[tuple[str, torch.Tensor]],
                   optim_scalars: dict[str, dict[str, Any]]) -> Manifest:
    return Manifest(step, ledger_json, optim_scalars, tuple(
        Entry(name, _dtype_name(t), tuple(t.shape), t.numel() * t.element_size()) for name, t in entries))


class StateTarget:
    """Where a fetched state lands: model tensors in place, optimizer state freshly allocated
    (the old one is dropped when loaded, so memory is not doubled)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._model_tensors = {f"model/{k}": v for k, v in model.state_dict().items()
                               if isinstance(v, torch.Tensor)}
        self._optimizer = optimizer
        self._optim_state: dict[int, dict[str, Any]] = {}

    def destination(self, entry: Entry) -> torch.Tensor:
        dtype = getattr(torch, entry.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise TransferError(f"unknown dtype {entry.dtype!r} for {entry.name}")
        if entry.name.startswith("model/"):
            t = self._model_tensors.get(entry.name)
            if t is None or tuple(t.shape) != entry.shape or t.dtype != dtype:
                raise TransferError(f"state entry {entry.name} {entry.dtype}{list(entry.shape)} does not "
                                    f"match the local model")
            return t
        parts = entry.name.split("/")
        if len(parts) != 3 or parts[0] != "optim" or not parts[1].isdigit():
            raise TransferError(f"unexpected state entry {entry.name!r}")
        t = torch.empty(entry.shape, dtype=dtype)
        if t.numel() * t.element_size() != entry.nbytes:
            raise TransferError(f"state entry {entry.name} claims {entry.nbytes} bytes for shape {entry.shape}")
        self._optim_state.setdefault(int(parts[1]), {})[parts[2]] = t
        return t

    def finish(self, manifest: Manifest) -> None:
        for idx, values in manifest.optim_scalars.items():
            self._optim_state.setdefault(int(idx), {}).update(values)
        groups = self._optimizer.state_dict()["param_groups"]
        self._optimizer.load_state_dict({"state": self._optim_state, "param_groups": groups})


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ledger_json: str = "",
                 step: int = -1) -> str:
    """A hash of parameters, buffers, optimizer state, ledger and step (for consistency checks)."""
    h = hashlib.sha256(f"{step}|{ledger_json}|".encode())
    entries, scalars = live_entries(model, optimizer)
    for name, t in entries:
        h.update(name.encode())
        h.update(tensor_bytes(t.contiguous()))
    h.update(json.dumps(scalars, sort_keys=True, default=str).encode())
    return h.hexdigest()
