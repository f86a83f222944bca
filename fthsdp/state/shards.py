"""This rank's own piece of a tensor: the local shard of a DTensor (FSDP2), or the tensor itself.

With FSDP2 every parameter, and every optimizer tensor that follows a parameter's shape
(Adam's moments), is a DTensor whose local tensor is the shard this rank owns. Catch-up,
digests and the memory checks work on these local tensors only: rank k moves, hashes and
holds ≈ 1/world_size of the state. `local` returns a view of the same memory, so writing into
it writes the parameter; `like` wraps a received local tensor back into a DTensor laid out
like its parameter (same mesh, placements, global shape and stride).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (same memory), or `t` itself; detached either way."""
    if isinstance(t, DTensor):
        return t.to_local().detach()
    return t.detach()


def is_dtensor(t: object) -> bool:
    return isinstance(t, DTensor)


def like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (a local tensor of the parameter's local shape) as the parameter holds it: moved
    to the parameter's device and, for a DTensor parameter, wrapped as its shard."""
    if not isinstance(param, DTensor):
        return value
    shard = value.to(param.to_local().device)
    return DTensor.from_local(shard, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage behind this rank's piece of `t` (what it really holds in memory)."""
    piece = local(t)
    return piece.untyped_storage().nbytes()
