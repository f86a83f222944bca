"""One rank of a 2-rank FSDP2 replica (Gloo) that measures what the runtime relies on, as JSON.

Run as `python -m tests.runtime.fsdp_probe PORT RANK OUT_JSON` (tests/runtime/test_fsdp_shards.py
starts both ranks): how many bytes of parameters and optimizer state this rank really holds
(storage sizes), how many bytes its catch-up entries carry, and which reduce-scatter outputs
the all-reduce hook may leave to finish later (fthsdp/sync/fsdp.py) under each setting.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from fthsdp.state.shards import storage_bytes
from fthsdp.state.stream import live_entries
from fthsdp.sync.fsdp import install_all_reduce_hooks


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 63)).to(dtype)


def _sharded(mesh, dtype=torch.float32, mp: MixedPrecisionPolicy | None = None) -> torch.nn.Module:
    model = _model(dtype)
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    for layer in (model[0], model[2]):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _deferrals(model: torch.nn.Module, backwards: int = 1, dtype=torch.float32) -> list[list]:
    seen: list = []
    install_all_reduce_hooks(model, lambda shard, deferred: seen.append([str(shard.dtype), deferred]))
    for _ in range(backwards):  # a second backward without zero_grad accumulates
        model(torch.randn(4, 64, dtype=dtype)).sum().backward()
    return seen


def main(port: int, rank: int, out: str) -> int:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    mesh = init_device_mesh("cpu", (2,))
    model = _sharded(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    tensors = [t for per in opt.state.values() for t in per.values() if isinstance(t, torch.Tensor) and t.dim()]
    entries, _ = live_entries(model, opt)
    result = {
        "full_param_bytes": sum(p.numel() * p.element_size() for p in _model().parameters()),
        "param_storage_bytes": sum(storage_bytes(p) for p in model.parameters()),
        "optim_storage_bytes": sum(storage_bytes(t) for t in tensors),
        "catch_up_entry_bytes": sum(t.numel() * t.element_size() for _, t in entries),
        "deferred": {
            "float32": _deferrals(_sharded(mesh)),
            "accumulating": _deferrals(_sharded(mesh), backwards=2),
            "bf16_compute_fp32_params": _deferrals(_sharded(mesh, mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16))),
            "bf16_params_fp32_reduce": _deferrals(_sharded(mesh, torch.bfloat16, MixedPrecisionPolicy(
                reduce_dtype=torch.float32)), dtype=torch.bfloat16),
            "float16": _deferrals(_sharded(mesh, torch.float16), dtype=torch.float16),
        },
    }
    try:
        install_all_reduce_hooks(_sharded(init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard"))), lambda shard, deferred: None)
        result["hsdp_refused"] = ""
    except ValueError as exc:
        result["hsdp_refused"] = str(exc)
    with open(out, "w") as f:
        json.dump(result, f)
    # Rank 0 serves the store: it leaves only once rank 1 is done with it (the mesh above makes
    # groups rank by rank from the store, so rank 0 can get here first; its exit reset rank 1).
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
