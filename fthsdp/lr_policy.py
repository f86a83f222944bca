"""Learning-rate scaling when fewer replicas than configured contribute (pure).

With h healthy replicas out of n the summed gradient is divided by h, so the
effective batch shrinks by h/n. "linear" scales the learning rate by h/n,
"sqrt" by sqrt(h/n) (the default; the controller uses it too), "none" keeps it.
"quorum" means: use the quorum answer's lr_scale as given.
"""

from __future__ import annotations

import math


def lr_scale(policy: str, healthy: int, total: int, quorum_lr_scale: float) -> float:
    if policy == "quorum":
        return quorum_lr_scale if quorum_lr_scale > 0 else 1.0
    if total <= 0 or healthy <= 0:
        raise ValueError(f"healthy and total replicas must be > 0, got healthy={healthy} total={total}")
    fraction = min(healthy / total, 1.0)
    if policy == "none":
        return 1.0
    if policy == "linear":
        return fraction
    if policy == "sqrt":
        return math.sqrt(fraction)
    raise ValueError(f"unknown lr policy {policy!r}; expected quorum, none, linear or sqrt")
