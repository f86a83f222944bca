"""What a catch-up source serves: this rank's state at the start of a step, taken once.

    held = take(step, ledger_json, model, optimizer, registry, copy_cpu=False)
    manifest, tensors = held.served()      # on the state server's threads

State on a GPU is always copied, into pinned host memory, on a side stream at the step
boundary (the paper's GPU-to-CPU copy): the copies overlap this step's forward and backward
(which read the state but never write it); `served()` waits for them, and the Manager calls
it (through `ServedState.release`) before the optimizer step may change the state. Such a
snapshot is immutable, so the source keeps training while its fetchers read it.
State in CPU memory is served in place (no second copy in memory: the source then holds its
optimizer step until its fetchers have it), unless `copy_cpu` asks for a copy too.
Registered state is serialized anew, so it is always a copy. Only this rank's local shards
are taken (fthsdp/state/shards.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from fthsdp.state.registry import StateRegistry
from fthsdp.state.stream import Manifest, build_manifest, host_buffer, live_entries


@dataclass
class HeldSnapshot:
    step: int
    manifest: Manifest
    tensors: list[torch.Tensor]
    copied: bool                          # immutable: the live state may move on while it is served
    ready: list[torch.cuda.Event]         # the device-to-host copies (one per device)

    def served(self) -> tuple[Manifest, list[torch.Tensor]]:
        for event in self.ready:
            event.synchronize()
        return self.manifest, self.tensors

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def take(step: int, ledger_json: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         registry: StateRegistry, copy_cpu: bool = False) -> HeldSnapshot:
    entries, scalars = live_entries(model, optimizer)
    in_place = any(t.device.type == "cpu" for _, t in entries) and not copy_cpu
    entries += registry.entries()
    streams: dict[torch.device, torch.cuda.Stream] = {}
    tensors = []
    for _, t in entries:
        if t.device.type == "cuda":
            tensors.append(_device_to_host(t, streams))
        elif copy_cpu:
            tensors.append(t.clone())
        else:
            tensors.append(t)
    ready = [stream.record_event() for stream in streams.values()]
    groups = optimizer.state_dict()["param_groups"]
    manifest = build_manifest(step, ledger_json, entries, scalars, groups)
    return HeldSnapshot(step, manifest, tensors, not in_place, ready)


def _device_to_host(t: torch.Tensor, streams: dict[torch.device, torch.cuda.Stream]) -> torch.Tensor:
    stream = streams.get(t.device)
    if stream is None:
        stream = streams[t.device] = torch.cuda.Stream(device=t.device)
        stream.wait_stream(torch.cuda.current_stream(t.device))  # the state as of the step boundary
    host = host_buffer(t.shape, t.dtype)
    with torch.cuda.stream(stream):
        host.copy_(t.contiguous(), non_blocking=True)
    return host


class ServedState:
    """This rank as a catch-up source: the step it serves and the one snapshot taken of it.

    `serve(step, ledger)` when a step begins; `snapshot()` from the state server's threads
    (or at the plan, on the training thread, when fetchers are expected); `release()` when the
    state is about to change: the snapshot to keep serving if it is an immutable copy. A
    sharded model's snapshot is only taken on the training thread: FSDP swaps a module's
    parameters during forward, so another thread could read them half-swapped."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, registry: StateRegistry,
                 copy_cpu: bool, sharded: bool) -> None:
        self._model, self._optimizer, self._registry = model, optimizer, registry
        self._copy_cpu, self._sharded = copy_cpu, sharded
        self._lock = threading.Lock()
        self._serving: tuple[int, str] | None = None
        self._held: HeldSnapshot | None = None
        self.training_thread = threading.current_thread()

    def serve(self, step: int, ledger_json: str) -> None:
        with self._lock:
            if self._serving is None or self._serving[0] != step:
                self._held = None
            self._serving = (step, ledger_json)

    def release(self) -> HeldSnapshot | None:
        """Stop serving; the snapshot of the step served when it is an immutable copy. Call
        `served()` on it before the state changes: that waits for its device-to-host copies."""
        with self._lock:
            held, serving = self._held, self._serving
            self._serving = self._held = None
        return held if held is not None and held.copied and serving is not None and held.step == serving[0] \
            else None

    def snapshot(self) -> tuple[Manifest, list[torch.Tensor]]:
        """The state at the start of the step served, taken once per step, so every fetcher
        of that step gets the same."""
        with self._lock:
            held, serving = self._held, self._serving
            if serving is None:
                raise RuntimeError("this rank is not serving its state now")
            if held is None or held.step != serving[0]:
                if self._sharded and threading.current_thread() is not self.training_thread:
                    raise RuntimeError(f"no snapshot of step {serving[0]} was taken: no fetcher was planned")
                held = self._held = take(serving[0], serving[1], self._model, self._optimizer, self._registry,
                                         self._copy_cpu)
        return held.served()
