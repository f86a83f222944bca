"""The training state beyond model and optimizer: registered objects and the RNG streams.

    manager.register_state("scheduler", lr_scheduler)   # anything with state_dict()/load_state_dict()
    manager.register_rng()                              # torch, numpy and Python `random`

Registered state is replicated state: equal on every replica after a commit. It travels
with catch-up (as `user/<name>` entries, fthsdp/state/stream.py), goes into checkpoints,
and into the digest the controller compares across replicas. So change registered
objects only between steps -- after a commit, e.g. `scheduler.step()` when the step
returned True -- never inside one, and keep per-replica positions in the data ledger
(`manager.batches`), not here. Payloads from peers are loaded with
`torch.load(weights_only=True)`: tensors, numbers, strings and containers only.

The RNG streams are owned by the runtime when registered: every commit reseeds torch
(CUDA included), numpy's global RNG and Python's `random` from the next value of a hash
chain, and every retry reseeds them from the current one. So a retried step draws the same
numbers again, and a replica that caught up draws what its source draws: the chain value
is all the RNG state there is, and it travels like any registered state.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
from typing import Any, Protocol

import numpy as np
import torch

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
RNG_NAME = "rng"
MAX_PAYLOAD_BYTES = 64 << 20
_SEED_MASK = (1 << 63) - 1
ACCEPTED = ("register_state accepts objects with state_dict() and load_state_dict() whose state is the same on "
            "every replica after a commit (an LR scheduler, a loss scaler, a counter).")
DATA_INSTEAD = ("For data, the ledger keeps each replica's position: pass fthsdp.data.ShuffledLoader(...).batch_at "
                "(a map-style Dataset) or fthsdp.data_stream.StreamBatches(...).batch_at (a torchdata "
                "StatefulDataLoader) to manager.batches(); see docs/architecture.md, 'Data'.")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class RngStreams:
    """The runtime-owned RNG streams (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed & _SEED_MASK
        self.apply()

    def apply(self) -> None:
        """Seed every stream from the current chain value (the start of a step attempt)."""
        torch.manual_seed(self.seed)
        np.random.seed(self.seed % (1 << 32))
        random.seed(self.seed)

    def advance(self) -> None:
        """After a commit: the next chain value."""
        digest = hashlib.sha256(self.seed.to_bytes(8, "big")).digest()
        self.seed = int.from_bytes(digest[:8], "big") & _SEED_MASK
        self.apply()

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        seed = state.get("seed") if isinstance(state, dict) else None
        if type(seed) is not int or not 0 <= seed <= _SEED_MASK:
            raise ValueError(f"RNG state must be {{'seed': 0..2**63-1}}, got {state!r:.200}")
        self.seed = seed
        self.apply()


class StateRegistry:
    def __init__(self) -> None:
        self._objects: dict[str, Stateful] = {}
        self.rng: RngStreams | None = None

    def register(self, name: str, obj: Stateful) -> None:
        if not NAME.match(name):
            raise ValueError(f"state name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
        if name in self._objects:
            raise ValueError(f"state {name!r} is registered already")
        if isinstance(obj, (torch.utils.data.DataLoader, torch.utils.data.Sampler)):
            raise TypeError(f"state {name!r} ({type(obj).__name__}) is a data position, which differs from replica "
                            f"to replica; registered state is the same on every replica. {ACCEPTED} {DATA_INSTEAD}")
        for method in ("state_dict", "load_state_dict"):
            if not callable(getattr(obj, method, None)):
                raise TypeError(f"state {name!r} ({type(obj).__name__}) has no {method}() method. {ACCEPTED} "
                                f"{DATA_INSTEAD}")
        self._objects[name] = obj

    def register_rng(self, seed: int | None = None) -> RngStreams:
        if self.rng is not None:
            raise ValueError("the RNG streams are registered already")
        self.rng = RngStreams(torch.initial_seed() if seed is None else seed)
        self.register(RNG_NAME, self.rng)
        return self.rng

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._objects)

    def state_dicts(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in sorted(self._objects.items())}

    def load_state_dicts(self, states: dict[str, Any], where: str) -> None:
        """Load every registered object from `states` (a checkpoint's or a peer's)."""
        if set(states) != set(self._objects):
            raise ValueError(f"{where} holds state {sorted(states)}, this rank registered {sorted(self._objects)}")
        for name, obj in sorted(self._objects.items()):
            obj.load_state_dict(states[name])

    def entries(self) -> list[tuple[str, torch.Tensor]]:
        """Each object's state_dict serialized, as `user/<name>` byte tensors for a transfer."""
        out = []
        for name, state in self.state_dicts().items():
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getvalue()
            if len(data) > MAX_PAYLOAD_BYTES:
                raise ValueError(f"state {name!r} serializes to {len(data)} bytes, more than {MAX_PAYLOAD_BYTES}")
            out.append((f"user/{name}", torch.frombuffer(bytearray(data), dtype=torch.uint8)))
        return out

    def decode(self, payloads: dict[str, bytes]) -> dict[str, Any]:
        """A peer's payloads as state_dicts (safe loading: no code runs); ValueError when bad."""
        states = {}
        for name, data in payloads.items():
            try:
                states[name] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad payload
                raise ValueError(f"registered state {name!r} from the source does not load: {exc}") from None
        return states
