"""The replica's own process group (its ranks, for FSDP2), safe under `torchrun --max-restarts`.

torchrun's agent keeps one TCPStore across the restarts of its workers (MASTER_PORT, with
TORCHELASTIC_USE_AGENT_STORE=True), and torch's env:// rendezvous reads it without a
per-attempt prefix: a restarted rank finds the addresses the previous attempt's ranks
published and Gloo's full mesh dials those dead ports ("connectFullMesh failed ... Connection
refused") until a later restart happens to publish first. Under torchrun this opens the
group on that store under a prefix of the attempt (TORCHELASTIC_RESTART_COUNT), so every
attempt meets only its own ranks. Elsewhere (an agent, plain env) it is env:// as usual.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist


def init_replica_group(backend: str, rank: int, world_size: int, timeout: timedelta) -> None:
    """dist.init_process_group for this replica's ranks (MASTER_ADDR, MASTER_PORT from the env)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"fthsdp/attempt_{attempt}", store), rank=rank,
                            world_size=world_size, timeout=timeout)
