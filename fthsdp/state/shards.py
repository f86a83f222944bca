"""This rank's own piece of a tensor: the local shard of a DTensor (FSDP2), or the tensor itself.

With FSDP2 every parameter, and every optimizer tensor that follows a parameter's shape
(Adam's moments), is a DTensor whose local tensor is the shard this rank owns. Catch-up,
digests and the memory checks work on these local tensors only: rank k moves, hashes and
holds ≈ 1/world_size of the state. `local` returns a view of the same memory, so writing into
it writes the parameter; `like` wraps a received local tensor back into a DTensor laid out
like its parameter (same mesh, placements, global shape and stride).

`torch.distributed.tensor` is not imported here: it is about a fifth of a trainer's import time,
and until something imported it (FSDP2 does) no tensor can be a DTensor.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def _dtensor_class() -> type | None:
    """DTensor, if its module is loaded; None while no DTensor can exist."""
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def is_dtensor(t: object) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (same memory), or `t` itself; detached either way."""
    if is_dtensor(t):
        return t.to_local().detach()
    return t.detach()


def like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (a local tensor of the parameter's local shape) as the parameter holds it: moved
    to the parameter's device and, for a DTensor parameter, wrapped as its shard."""
    if not is_dtensor(param):
        return value
    shard = value.to(param.to_local().device)
    return _dtensor_class().from_local(shard, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage behind this rank's piece of `t` (what it really holds in memory)."""
    piece = local(t)
    return piece.untyped_storage().nbytes()


def process_group_of(model: torch.nn.Module) -> dist.ProcessGroup:
    """The process group a sharded model's parameters are sharded over (the replica's ranks)."""
    for param in model.parameters():
        if is_dtensor(param):
            return param.device_mesh.get_group()
    raise ValueError(f"{type(model).__name__} has no sharded (DTensor) parameter")


def agree_on_min(value: int | None, group: dist.ProcessGroup | None) -> int | None:
    """The smallest of every rank's `value` (None below all), the same on every rank of `group`."""
    if group is None:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    t = torch.tensor([-1 if value is None else value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return None if int(t.item()) < 0 else int(t.item())
