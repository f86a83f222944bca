"""The byte layout of a rank's live state, for catch-up transfers (no sockets here).

A transfer body is:
    8-byte big-endian manifest length | manifest JSON | manifest tag | every tensor's raw
    bytes in manifest order | stream tag.
A transfer may travel as several lanes (connections) at once (`lane_parts`): each lane's body
is the same but for the tensor bytes, which are the lane's share of them (a contiguous run of
whole pieces), and each lane is tagged over its own request's nonce.
Both tags are HMAC-SHA256 under the state key of the job secret (fthsdp/state/request_auth.py),
over the fetch request's nonce, then the header and manifest (the manifest tag), continued
over a digest of each 8 MiB piece of every tensor (the stream tag): the 64-bit sum of each
4 KiB block of the piece (its 8-byte words added, wrapping; numpy does it in one pass at
memory speed, 5-10 times faster than hashing the bytes themselves, and the block sums are
1/512 of the bytes to hash), the piece's last partial block as it is, and the piece's
length. So a source proves it holds the job secret, for this very request, before the
fetcher parses its manifest or writes one byte of state, and the stream tag checks the
bytes before anything is adopted: a flipped, dropped or inserted word, a block moved or
damaged in transit fails it (two words swapped inside one 4 KiB block
would not: no transport moves data that way). The block sums detect damage, not a forger on
the wire: like FTAR's data, a stream between two trainers that both hold the secret trusts
the connection it authenticated. A source serving without authentication (key None) tags
with an empty key: a checksum, no proof.
The manifest names each tensor (`model/<key>`, `optim/<param index>/<key>`, or
`user/<name>`: a registered object's serialized state, see fthsdp/state/registry.py) with
its dtype, shape and byte count, and carries the small non-tensor state: the step, the
data ledger, and the optimizer's non-tensor per-parameter values. Sharded state (FSDP2
DTensors) travels as this rank's local shards (fthsdp/state/shards.py): rank k of a behind
replica receives exactly rank k's pieces. Model tensors in CPU memory are written in place,
and so are optimizer tensors this rank already holds (`StateTarget`), so the state is never
held twice; tensors on a GPU are received into host staging and copied onto the device when
the protocol adopts the fetched state. Both ends digest each PART_BYTES part of a piece right
after they sent or received it, while it is in cache; consecutive small parts are sent and
received as one run (`lane_runs`: one system call for many small tensors). Every entry a peer
announces is checked against this rank's own model, optimizer and registry before any
memory is allocated for it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import hmac
import json
import math
import mmap
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from fthsdp.errors import TransferError
from fthsdp.state.shards import is_dtensor, like, local

PIECE_BYTES = 8 << 20
#: what one end sends or receives, then digests, at a time (a multiple of BLOCK_BYTES that
#: divides PIECE_BYTES), and what wakes the fetcher (`wire.Response`). 512 KiB stays in the
#: core's L2 between the copy and the digest, but since the fetcher is woken once a part is
#: queued (not at each arrival) 1 MiB won: two fetches at once on 2 cores 72-73 ms best of 20
#: against 81-105, each end's CPU a fifth to a half lower; one 1 GiB fetch within its spread
#: (docs/architecture.md, "Receives woken a part at a time, again")
PART_BYTES = 1 << 20
#: the most connections (lanes) one fetch of one rank's state may use at once
MAX_LANES = 8
HEADER = struct.Struct(">Q")
TAG_BYTES = 32
MAX_MANIFEST_BYTES = 256 << 20
MAX_ENTRIES = 1 << 20
MAX_NAME_CHARS = 512
MAX_OPTIMIZER_KEYS = 16  # per parameter (Adam keeps 3)

__all__ = ["TransferError"]  # re-exported: fetch and serve raise it


#: the digest's block: a page. Measured against 1 KiB (numpy calls its add loop once a block, so
#: the block's size sets the per-call share): 9.9 against 16.5 us a 512 KiB part in cache, and a
#: 1 GiB whole-state fetch 230-245 against 245-270 ms (best of 8, three alternations); detecting
#: damage is the same (docs/architecture.md, "The data plane")
BLOCK_BYTES = 4096
_LENGTH = struct.Struct(">Q")
#: the transfer's format, named in the tags (a source and a fetcher of different formats fail
#: the manifest tag, and the error names this)
STREAM_FORMAT = "fthsdp state stream v4"
_STREAM_LABEL = STREAM_FORMAT.encode() + b"\0"


class StreamTag:
    """The transfer's tags (see the module docstring). Feed the header and manifest with
    `update_bytes`, take `value()` as the manifest tag, then feed the tensor bytes piece by piece
    (PIECE_BYTES of a tensor at most): each piece's parts in order with `update_part` (every part
    but a piece's last a whole number of BLOCK_BYTES blocks), then `end_piece`; `value()` is then
    the stream tag. Both ends digest a PART_BYTES part right after they sent or received it, while
    it is in the core's cache."""

    def __init__(self, key: bytes | None, nonce: bytes) -> None:
        self._mac = hmac.new(key or b"", _STREAM_LABEL + _LENGTH.pack(len(nonce)) + nonce, hashlib.sha256)
        self._sums = np.empty(PIECE_BYTES // BLOCK_BYTES, dtype="<u8")
        self._blocks = 0      # block sums of the current piece so far
        self._length = 0      # bytes of the current piece so far
        self._rest = b""      # the piece's last partial block (its last part's tail)

    def update_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Small control data (header, manifest)."""
        self._mac.update(data)

    def update_part(self, part: memoryview) -> None:
        if self._rest:
            raise ValueError("a part of a piece came after a part that did not end on a block")
        n = len(part)
        if self._length + n > PIECE_BYTES:
            raise ValueError(f"pieces are at most {PIECE_BYTES} bytes, got {self._length + n}")
        k = n // BLOCK_BYTES
        if k:  # numpy releases the GIL; torch.sum would be faster but splits itself over the process's threads
            blocks = np.frombuffer(part, dtype="<u8", count=k * BLOCK_BYTES // 8).reshape(k, BLOCK_BYTES // 8)
            np.add.reduce(blocks, axis=1, out=self._sums[self._blocks:self._blocks + k])
        self._blocks += k
        self._length += n
        self._rest = bytes(part[k * BLOCK_BYTES:])

    def end_piece(self) -> None:
        self._mac.update(self._sums[:self._blocks])
        self._mac.update(self._rest)
        self._mac.update(_LENGTH.pack(self._length))
        self._blocks, self._length, self._rest = 0, 0, b""

    def update_run(self, run: list[tuple[bool, memoryview]]) -> None:
        """The parts of one of `lane_runs`, just sent or received."""
        for piece_ends, part in run:
            self.update_part(part)
            if piece_ends:
                self.end_piece()

    def update_piece(self, piece: memoryview) -> None:
        """A whole piece at once."""
        self.update_part(piece)
        self.end_piece()

    def value(self) -> bytes:
        """The tag of everything fed so far (feeding may go on)."""
        return self._mac.copy().digest()


def tags_match(sent: bytes | bytearray, computed: bytes) -> bool:
    return hmac.compare_digest(bytes(sent), computed)


def _lane_pieces(sizes: list[int], lane: int, lanes: int) -> Iterator[tuple[int, int, int]]:
    """(tensor index, offset, length) of each PIECE_BYTES piece that falls to `lane`: the pieces
    that start in the lane-th of `lanes` equal shares of all the bytes (contiguous runs)."""
    total, start = sum(sizes), 0
    for i, size in enumerate(sizes):
        for off in range(0, size, PIECE_BYTES):
            if (start + off) * lanes // total == lane:
                yield i, off, min(PIECE_BYTES, size - off)
        start += size


def lane_bytes(sizes: list[int], lane: int = 0, lanes: int = 1) -> int:
    """The tensor bytes one lane of a transfer carries."""
    return sum(n for _, _, n in _lane_pieces(sizes, lane, lanes))


def lane_parts(views: list[memoryview], lane: int = 0, lanes: int = 1) -> Iterator[tuple[bool, memoryview]]:
    """What one lane of a transfer carries, in order: (piece ends?, part) for each PART_BYTES part
    of each PIECE_BYTES piece of the tensors' bytes (`views`, in manifest order) that falls to
    `lane`. A transfer may travel as several lanes (connections) at once, each a contiguous run
    of whole pieces, the same on both ends."""
    for i, off, n in _lane_pieces([len(v) for v in views], lane, lanes):
        piece = views[i][off:off + n]
        for sub in range(0, n, PART_BYTES):
            yield sub + PART_BYTES >= n, piece[sub:sub + PART_BYTES]


#: parts shorter than this travel in runs: one sendmsg / recvmsg_into moves a run of them (at
#: most PART_BYTES and MAX_RUN_PARTS parts), so a state of many small tensors (norms, biases,
#: Adam's step counts) costs each end a few system calls and wake-ups, not one per tensor
#: (docs/architecture.md, "The data plane"). The bytes on the wire are the same either way.
SMALL_PART_BYTES = 64 << 10
MAX_RUN_PARTS = 256  # below the kernel's IOV_MAX (1024)


def lane_runs(views: list[memoryview], lane: int = 0, lanes: int = 1) -> Iterator[list[tuple[bool, memoryview]]]:
    """`lane_parts`, grouped: each run is one part of at least SMALL_PART_BYTES, or consecutive
    shorter parts (together at most PART_BYTES, so still in cache when digested)."""
    run: list[tuple[bool, memoryview]] = []
    size = 0
    for piece_ends, part in lane_parts(views, lane, lanes):
        n = len(part)
        if run and (n >= SMALL_PART_BYTES or size + n > PART_BYTES or len(run) >= MAX_RUN_PARTS):
            yield run
            run, size = [], 0
        run.append((piece_ends, part))
        size += n
        if n >= SMALL_PART_BYTES:
            yield run
            run, size = [], 0
    if run:
        yield run


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
    optim_groups: tuple[dict[str, Any], ...] = ()  # the optimizer's param_groups (learning rates...)

    def to_bytes(self) -> bytes:
        return self._encoded

    @functools.cached_property
    def _encoded(self) -> bytes:  # a source sends it, and counts it in its Content-Length, per request
        body = json.dumps({
            "step": self.step, "ledger": self.ledger_json, "optim_scalars": self.optim_scalars,
            "optim_groups": list(self.optim_groups),
            "entries": [[e.name, e.dtype, list(e.shape), e.nbytes] for e in self.entries],
        }).encode()
        return HEADER.pack(len(body)) + body

    @classmethod
    def from_json(cls, body: bytes) -> "Manifest":
        """Parse a peer's manifest; TransferError names what is malformed."""
        try:
            raw = json.loads(body)
            entries = tuple(Entry(n, d, tuple(s), b) for n, d, s, b in raw["entries"])
            manifest = cls(raw["step"], raw["ledger"], raw["optim_scalars"], entries, tuple(raw["optim_groups"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise TransferError(f"malformed state manifest: {exc!r}") from None
        if type(manifest.step) is not int or manifest.step < 0 or not isinstance(manifest.ledger_json, str):
            raise TransferError(f"state manifest step {manifest.step!r} or its ledger is malformed")
        if (not isinstance(manifest.optim_scalars, dict) or len(entries) > MAX_ENTRIES
                or not all(isinstance(g, dict) for g in manifest.optim_groups)):
            raise TransferError(f"state manifest with {len(entries)} entries is malformed or too large")
        for e in entries:
            if not (isinstance(e.name, str) and 0 < len(e.name) <= MAX_NAME_CHARS and isinstance(e.dtype, str)
                    and all(type(d) is int and d >= 0 for d in e.shape) and type(e.nbytes) is int
                    and e.nbytes >= 0):
                raise TransferError(f"malformed state entry {str(e)[:200]}")
        return manifest

    @property
    def total_bytes(self) -> int:
        return len(self.to_bytes()) + sum(e.nbytes for e in self.entries) + 2 * TAG_BYTES

    def body_bytes(self, lane: int = 0, lanes: int = 1) -> int:
        """The length of one lane's body: the manifest, its tag, the lane's tensor bytes, its tag."""
        return len(self.to_bytes()) + lane_bytes([e.nbytes for e in self.entries], lane, lanes) + 2 * TAG_BYTES


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor (no copy)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"state tensors must be contiguous CPU tensors, got device={t.device} "
                         f"contiguous={t.is_contiguous()}")
    t = t.detach()
    try:
        return memoryview(t.numpy()).cast("B")
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, float8...): its bytes as uint8
        return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def host_buffer(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Host memory for state on its way to or from a GPU: pinned when CUDA is there."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=torch.cuda.is_available())


#: fresh CPU memory of at least this size is asked for in huge pages
HUGE_PAGE_MIN_BYTES = 4 << 20


def fresh_cpu_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """New CPU memory that a fetch writes once, through the kernel: large ones in transparent
    huge pages where the kernel grants them (MADV_HUGEPAGE), since faulting in fresh memory 4 KiB
    at a time cost more than receiving the bytes (docs/architecture.md, "The data plane")."""
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE_PAGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # a kernel without transparent huge pages: 4 KiB pages it is
    return torch.frombuffer(region, dtype=dtype, count=numel).view(shape)  # the tensor keeps the region


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def live_entries(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                 ) -> tuple[list[tuple[str, torch.Tensor]], dict[str, dict[str, Any]]]:
    """(name, tensor) for every model and optimizer tensor (views of this rank's live pieces),
    and the optimizer's non-tensor per-parameter values."""
    entries = [(f"model/{k}", local(v)) for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)]
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(per_param.items()):
            if isinstance(value, torch.Tensor):
                entries.append((f"optim/{idx}/{key}", local(value)))
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return entries, scalars


def build_manifest(step: int, ledger_json: str, entries: list[tuple[str, torch.Tensor]],
                   optim_scalars: dict[str, dict[str, Any]],
                   optim_groups: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()) -> Manifest:
    return Manifest(step, ledger_json, optim_scalars, tuple(
        Entry(name, _dtype_name(t), tuple(t.shape), t.numel() * t.element_size()) for name, t in entries),
        tuple(optim_groups))


@dataclass
class Fetched:
    """A verified transfer, staged: model tensors (and optimizer tensors the rank held) are
    already in place; the optimizer and registered state are loaded by the Manager on the
    training thread when the protocol says so (AdoptFetched)."""
    manifest: Manifest
    optimizer_state: dict[str, Any]       # what optimizer.load_state_dict takes
    user_payloads: dict[str, bytes]
    device_copies: list[tuple[torch.Tensor, torch.Tensor]]  # (model tensor on a GPU, its received bytes)

    def adopt_model(self) -> None:
        """Copy the model tensors received into host staging onto their device (at commit)."""
        with torch.no_grad():
            for live, staged in self.device_copies:
                live.copy_(staged)


class StateTarget:
    """Where a fetched state lands: model tensors in place; optimizer tensors in place too when
    this rank's optimizer already holds a CPU tensor of that entry's shape and dtype (a replica
    that trained before), else in fresh memory; registered state fresh. The optimizer and
    registered state are loaded when the step commits (AdoptFetched: load_state_dict then holds
    the very tensors received). Until then the live tensors a fetch wrote are stale but unseen
    (fthsdp/step/protocol.py: a torn rank trains nothing until a commit adopts a whole fetch).
    Build it on the training thread (reading an FSDP2 model's state_dict swaps its parameters,
    so never while it runs forward); `fresh()` gives another empty target of the same layout,
    for the fetch thread's next attempt."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, user_names: frozenset[str] = frozenset(),
                 max_user_bytes: int = 64 << 20) -> None:
        self._model_tensors = {f"model/{k}": local(v) for k, v in model.state_dict().items()
                               if isinstance(v, torch.Tensor)}
        self._params = [p for g in optimizer.param_groups for p in g["params"]]
        self._param_shapes = [tuple(local(p).shape) for p in self._params]
        # (param index, key) -> (the local tensor, the value the optimizer holds: a DTensor for FSDP2)
        self._live_optim = {(i, key): (local(v), v) for i, p in enumerate(self._params)
                            for key, v in optimizer.state.get(p, {}).items() if isinstance(v, torch.Tensor)}
        self._device_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._group_params = [g["params"] for g in optimizer.state_dict()["param_groups"]]
        self._user_names, self._max_user_bytes = user_names, max_user_bytes
        self._optim_state: dict[int, dict[str, Any]] = {}
        self._user: dict[str, torch.Tensor] = {}
        self._views: dict[int, memoryview] | None = None  # id of a live tensor -> its bytes (`prepare`)

    def fresh(self) -> "StateTarget":
        target = copy.copy(self)
        target._device_copies, target._optim_state, target._user = [], {}, {}
        return target

    def prepare(self) -> None:
        """Make the byte views of the tensors a fetch writes in place (this rank's CPU model and
        optimizer tensors) ahead of the manifest: the fetch does it while its source answers."""
        if self._views is None:
            live = [*self._model_tensors.values(), *(t for t, _ in self._live_optim.values())]
            self._views = {id(t): tensor_bytes(t) for t in live if t.device.type == "cpu" and t.is_contiguous()}

    def view(self, entry: Entry) -> memoryview:
        """`destination(entry)` as bytes to write."""
        t = self.destination(entry)
        known = self._views.get(id(t)) if self._views is not None else None
        return known if known is not None else tensor_bytes(t)

    def destination(self, entry: Entry) -> torch.Tensor:
        dtype = getattr(torch, entry.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise TransferError(f"unknown dtype {entry.dtype!r} for {entry.name}")
        if entry.name.startswith("model/"):
            t = self._model_tensors.get(entry.name)
            if t is None or tuple(t.shape) != entry.shape or t.dtype != dtype:
                raise TransferError(f"state entry {entry.name} {entry.dtype}{list(entry.shape)} does not "
                                    f"match the local model")
            if t.device.type != "cpu":  # received into host memory, copied onto the device at commit
                staged = host_buffer(t.shape, t.dtype)
                self._device_copies.append((t, staged))
                return staged
            return t
        kind, _, rest = entry.name.partition("/")
        if kind == "user":
            if rest not in self._user_names or dtype != torch.uint8 or len(entry.shape) != 1:
                raise TransferError(f"state entry {entry.name} is not registered here (registered: "
                                    f"{sorted(self._user_names)})")
            if entry.nbytes > self._max_user_bytes:
                raise TransferError(f"state entry {entry.name} has {entry.nbytes} bytes, more than "
                                    f"{self._max_user_bytes}")
            return self._sized(entry, self._user.setdefault(rest, torch.empty(entry.shape, dtype=torch.uint8)))
        index, _, key = rest.partition("/")
        if kind != "optim" or not index.isdigit() or not key or int(index) >= len(self._param_shapes):
            raise TransferError(f"unexpected state entry {entry.name!r}")
        per_param = self._optim_state.setdefault(int(index), {})
        shape = self._param_shapes[int(index)]
        if entry.shape not in (shape, ()) or len(per_param) >= MAX_OPTIMIZER_KEYS:
            raise TransferError(f"optimizer entry {entry.name} {list(entry.shape)} fits parameter {index} of "
                                f"shape {list(shape)} neither as a tensor of its shape nor as a scalar")
        per_param[key] = self._optimizer_destination(int(index), key, entry.shape, dtype)
        return self._sized(entry, per_param[key])

    def _optimizer_destination(self, index: int, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        live, _ = self._live_optim.get((index, key), (None, None))
        if live is not None and live.device.type == "cpu" and live.is_contiguous() and tuple(live.shape) == shape \
                and live.dtype == dtype:
            return live
        if torch.cuda.is_available():
            return host_buffer(shape, dtype)  # pinned, for the copy onto the device at load
        return fresh_cpu_tensor(shape, dtype)

    def _held_as(self, index: int, key: str, t: torch.Tensor) -> Any:
        """A received optimizer tensor as the optimizer holds it: the very value it holds when
        the tensor was received into it in place, else a shard of a DTensor parameter wrapped as
        that DTensor's shard again."""
        local_tensor, held = self._live_optim.get((index, key), (None, None))
        if t is local_tensor:
            return held
        param = self._params[index]
        return like(param, t) if is_dtensor(param) and t.dim() else t

    @property
    def expected_bytes(self) -> int:
        """The state this rank holds now (model and optimizer tensors): what a fetch will bring."""
        tensors = [*self._model_tensors.values(), *(t for t, _ in self._live_optim.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    @staticmethod
    def _sized(entry: Entry, t: torch.Tensor) -> torch.Tensor:
        if t.numel() * t.element_size() != entry.nbytes:
            raise TransferError(f"state entry {entry.name} claims {entry.nbytes} bytes for shape {list(entry.shape)}")
        return t

    def check(self, manifest: Manifest) -> None:
        """What the whole manifest must fit before any entry is stored."""
        names = {e.name.partition("/")[2] for e in manifest.entries if e.name.startswith("user/")}
        if names != self._user_names:
            raise TransferError(f"the source sent registered state {sorted(names)}; this rank registered "
                                f"{sorted(self._user_names)}")
        groups = [g.get("params") for g in manifest.optim_groups]
        if groups != self._group_params:
            raise TransferError(f"the source's optimizer has parameter groups {groups!r:.200}, this rank's "
                                f"{self._group_params!r:.200}")
        for idx, values in manifest.optim_scalars.items():
            if not str(idx).isdigit() or int(idx) >= len(self._param_shapes) or not isinstance(values, dict):
                raise TransferError(f"optimizer scalars for parameter {idx!r} do not fit this optimizer")

    def finish(self, manifest: Manifest) -> Fetched:
        optim: dict[int, dict[str, Any]] = {}
        for idx, values in self._optim_state.items():
            optim[idx] = {key: self._held_as(idx, key, t) for key, t in values.items()}
        for idx, values in manifest.optim_scalars.items():
            optim.setdefault(int(idx), {}).update(values)
        return Fetched(manifest, {"state": optim, "param_groups": [dict(g) for g in manifest.optim_groups]},
                       {name: t.numpy().tobytes() for name, t in self._user.items()}, self._device_copies)
