"""A digest of one rank's committed training state (pure: bytes in, SHA-256 out).

The digest covers the step, the data ledger, every model tensor, the optimizer's whole
state_dict (its tensors, its scalars, and its param_groups: a learning-rate schedule that
drifted shows), and every registered object's state_dict. Structures are hashed in a
canonical form (dict keys sorted, every value tagged with its type, tensors with dtype and
shape), never through pickle, whose bytes differ between equal objects. A sharded (FSDP2)
tensor is hashed as this rank's shard. Replicas that committed the same step must have equal
digests, rank by rank; the controller compares them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import numpy as np
import torch

from fthsdp.state.shards import local


def feed(h: "hashlib._Hash", obj: Any) -> None:
    """Hash `obj` canonically into `h`."""
    if isinstance(obj, torch.Tensor):
        t = local(obj)  # a sharded tensor: this rank's shard (the replica digest joins the ranks')
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(f"N{a.dtype}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)}".encode())
        for key in sorted(obj, key=repr):
            feed(h, key)
            feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for item in obj:
            feed(h, item)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"S{type(obj).__name__}:{obj!r}\0".encode())
    else:  # an object without a canonical form: its type and repr (document yours)
        h.update(f"O{type(obj).__qualname__}:{obj!r}\0".encode())


def rank_digest(step: int, ledger_json: str, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                user_states: Mapping[str, Any] | None = None) -> bytes:
    """SHA-256 (32 bytes) of this rank's committed state at the start of `step`. `optimizer`
    None: a semi-synchronous replica's inner optimizer, whose state is its own by design (the
    outer optimizer is registered state). `model` None: a streaming_diloco replica's model,
    which holds its own local fragments between their syncs (the global copy is registered state)."""
    h = hashlib.sha256(f"fthsdp-state-v1|{step}|{ledger_json}|".encode())
    feed(h, model.state_dict() if model is not None else None)
    feed(h, optimizer.state_dict() if optimizer is not None else None)
    feed(h, dict(user_states or {}))
    return h.digest()


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, ledger_json: str = "", step: int = -1,
                 user_states: Mapping[str, Any] | None = None) -> str:
    """The same digest in hex, for logs, records and tests."""
    return rank_digest(step, ledger_json, model, optimizer, user_states).hex()
