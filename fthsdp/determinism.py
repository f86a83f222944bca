"""Deterministic mode: a run that any other run of the same code, data and seed reproduces bit
for bit, so checkpoints of one step can be compared rank by rank (`fthsdp compare-checkpoints`)
to find a host that computes wrong (silent data corruption).

What it takes (RuntimeSettings.deterministic, env FTHSDP_DETERMINISTIC=1):
  * every operator deterministic: torch.use_deterministic_algorithms(True) (an operator without
    a deterministic implementation raises instead of silently varying), cuDNN deterministic and
    its auto-tuner off, the flash and memory-efficient attention kernels off (the math kernel is
    deterministic), and CUBLAS_WORKSPACE_CONFIG set before CUDA starts (cuBLAS needs it);
  * the same data in every iteration: batches come from the data ledger's positions (already
    so: `Manager.batches`), never from a loader's own shuffling;
  * the same random numbers: the runtime owns the torch, numpy and Python RNG streams and
    reseeds them per step from a chain that travels with the state (`Manager.register_rng`),
    so a retried or caught-up step draws what the first try drew.
"""

from __future__ import annotations

import os

import torch

#: What cuBLAS needs for deterministic GEMMs (":4096:8": 8 buffers of 4 MiB per stream).
CUBLAS_WORKSPACE = ":4096:8"
ENV_CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"


def apply() -> list[str]:
    """Switch this process to deterministic kernels; returns what was set (for the log)."""
    done = []
    if os.environ.get(ENV_CUBLAS_WORKSPACE) is None:
        os.environ[ENV_CUBLAS_WORKSPACE] = CUBLAS_WORKSPACE
        done.append(f"{ENV_CUBLAS_WORKSPACE}={CUBLAS_WORKSPACE}")
    torch.use_deterministic_algorithms(True)
    done.append("torch.use_deterministic_algorithms(True)")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    done.append("cudnn deterministic, auto-tuner off")
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp"):
        switch = getattr(torch.backends.cuda, name, None)
        if switch is not None:
            switch(False)
            done.append(f"torch.backends.cuda.{name}(False)")
    return done


def is_on() -> bool:
    return torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic \
        and not torch.backends.cudnn.benchmark
