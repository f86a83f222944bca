"""How an existing PyTorch loop adopts the runtime: an optimizer wrapper and a DDP hook.

    opt = FaultTolerantOptimizer(manager, torch.optim.AdamW(model.parameters()))
    for batch in manager.batches(batch_at):   # each batch begins a step: quorum, catch-up if behind
        opt.zero_grad()          # begins the step if the loop did not (idempotent within a step)
        loss = model(batch).loss
        loss.backward()
        opt.step(loss)           # averages gradients, votes, commits or retries -> bool

DDP users register `ddp_comm_hook` instead; `step()` then skips the flat reduction.
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as objects.
from typing import Any

import torch
import torch.distributed as dist

from fthsdp.manager import Manager


class FaultTolerantOptimizer:
    """Wraps a torch optimizer: zero_grad() starts the step, step() commits or retries it."""

    def __init__(self, manager: Manager, optimizer: torch.optim.Optimizer) -> None:
        if manager.optimizer is not optimizer:
            raise ValueError("wrap the same optimizer the Manager was built with")
        self.manager, self.optimizer = manager, optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.manager.begin_step()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, loss: float | torch.Tensor | None = None, tokens: int = 0) -> bool:
        """Returns True when the step committed; False when it will be retried (same batch again)."""
        value = None if loss is None else float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        return self.manager.end_step(value, tokens)


def ddp_comm_hook(manager: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DistributedDataParallel communication hook: `ddp.register_comm_hook(manager, ddp_comm_hook)`.

    Replaces DDP's all-reduce: averages the bucket inside the replica (the DDP process
    group must be the replica's group) and across replicas over FTAR. A failure is
    recorded as this step's "no" vote; the returned bucket is then discarded by the retry.
    """
    buffer = bucket.buffer()
    manager.reduce_bucket_(buffer)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
