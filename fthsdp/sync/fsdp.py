"""FSDP2 models under the runtime: every parameter group's reduce-scatter output goes to FTAR.

    hooks = install_all_reduce_hooks(model, on_shard)   # Manager.start() does this

FSDP2 (`torch.distributed.fsdp.fully_shard`) reduce-scatters each parameter group's
gradients inside the replica, then calls the group's all-reduce hook on the flat shard this
rank owns (`FSDPModule.set_all_reduce_hook`). That shard is what rank k all-reduces with rank
k of every other replica, so the hook hands it to `on_shard(shard, deferred)`:

- `deferred=True`: FSDP does nothing with the shard after the hook but view it as the
  parameters' sharded gradients, so the cross-replica reduction may finish later (the
  optimizer step waits for it): it overlaps the backward of the next group.
- `deferred=False`: FSDP reads or copies the shard right after the hook (a cast to another
  dtype, a post-division, CPU offload, gradient accumulation, post-accumulate hooks), so
  the reduction must be complete when the hook returns.

What FSDP does after the hook is decided by its parameter group's settings, which torch keeps
on internal objects; `_defer_safe` reads them and answers "not deferred" whenever it cannot
tell (correct, only slower).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

# Dtypes for which FSDP2 never divides after the hook (it folds the division into the
# reduce-scatter); other dtypes are divided after it, which must then see the finished sum.
_NO_POST_DIVIDE = (torch.float32, torch.bfloat16)

OnShard = Callable[[torch.Tensor, bool], None]


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    # Not imported here (a quarter of a trainer's import time): until something imported
    # torch.distributed.fsdp (fully_shard lives there), no module can be wrapped by it.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return []
    return [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    """True when some part of `model` is wrapped with FSDP2's fully_shard."""
    return bool(fsdp_modules(model))


def install_all_reduce_hooks(model: torch.nn.Module, on_shard: OnShard) -> int:
    """Hook every FSDP2 module of `model`; returns how many were hooked. A module that runs
    PyTorch's own HSDP (a 2-D mesh) is refused: replicas are fthsdp's to reduce across."""
    modules = fsdp_modules(model)
    for module in modules:
        for group in _groups(module):
            if getattr(group, "_is_hsdp", False):
                raise ValueError(f"{type(module).__name__} is sharded over a 2-D mesh (PyTorch's own HSDP); under "
                                 f"fthsdp shard each replica over its own ranks only (a 1-D mesh): FTAR reduces "
                                 f"across replicas")
        module.set_all_reduce_hook(_hook_for(module, on_shard))
    return len(modules)


def _hook_for(module: FSDPModule, on_shard: OnShard) -> Callable[[torch.Tensor], None]:
    def hook(reduce_output: torch.Tensor) -> None:
        on_shard(reduce_output, _defer_safe(module, reduce_output))
    return hook


def _groups(module: FSDPModule) -> list:
    try:
        return list(module._get_fsdp_state()._fsdp_param_groups)
    except AttributeError:
        return []


def _defer_safe(module: FSDPModule, reduce_output: torch.Tensor) -> bool:
    """Whether FSDP only views `reduce_output` after the hook (see the module docstring)."""
    if reduce_output.dtype not in _NO_POST_DIVIDE:
        return False
    groups = _groups(module)
    if not groups:
        return False
    for group in groups:
        try:
            if group.force_sum_reduction_for_comms or group._orig_dtype != reduce_output.dtype:
                return False
            for fsdp_param in group.fsdp_params:
                param = fsdp_param.sharded_param
                if (fsdp_param.offload_to_cpu or param.grad is not None
                        or getattr(param, "_post_accumulate_grad_hooks", None)):
                    return False
        except AttributeError:
            return False
    return True
