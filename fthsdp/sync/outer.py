"""A semi-synchronous replica's tensors: the global parameters, the pseudo-gradient, the outer step.

In `local_sgd` and `diloco` modes (RuntimeSettings.sync_mode) a replica trains
sync_every_steps (H) *inner* steps on its own group, then meets the others at a *sync*: one
step of the ordinary protocol whose "gradient" is the pseudo-gradient. The protocol
(fthsdp/step/protocol.py) decides when each of these happens; this class only moves tensors:

    begin_outer_step()            the model holds the global state G (a commit or a catch-up
                                  left it there): keep a copy of it
    ...H inner steps change the model to L (the script's inner optimizer)...
    take_pseudo_gradient()        pseudo = G - L (kept for every attempt of the sync); the model
                                  goes back to G, so the state served to a catch-up and
                                  digested is the global one
    reduce(sync, plan)            average the pseudo-gradient over the sync's contributors
                                  (a behind replica adds zeros), into a work buffer
    apply(lr_scale)               G := outer_step(G, average): SGD with outer_lr × lr_scale,
                                  outer_momentum, Nesterov (diloco), or G - average, i.e. the
                                  mean of the replicas' L (local_sgd); the model takes G

The outer optimizer runs on copies of this rank's local tensors (its shards when the model is
FSDP2-sharded), so it is the same code for every layout; its state is registered state
(`OUTER_STATE_NAME`): it travels with catch-up and checkpoints and is digested. Every replica
applies the same bytes (the FTAR result) to the same G with the same outer state, so after a
committed sync the global state is bitwise equal everywhere. The inner optimizer's state is
per replica by design (not digested); a catch-up takes its source's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from fthsdp.settings import RuntimeSettings
from fthsdp.state.shards import local
from fthsdp.step.plan import RankPlan
from fthsdp.sync.gradients import GradientSync, SyncResult

#: the outer optimizer's name among the registered state
OUTER_STATE_NAME = "fthsdp.outer_optimizer"


class OuterSync:
    """One rank's global copy, pseudo-gradient and outer optimizer (allocated here, no threads)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], settings: RuntimeSettings, sharded: bool) -> None:
        self.settings, self.sharded = settings, sharded
        self._params = list(params)
        with torch.no_grad():
            self._global = [torch.nn.Parameter(t.to(torch.float32, copy=True)) for t in self._locals]
        total = sum(t.numel() for t in self._global)
        device = self._global[0].device if self._global else torch.device("cpu")
        self._pseudo = torch.zeros(total, dtype=torch.float32, device=device)
        self._work = torch.zeros_like(self._pseudo)
        if settings.sync_mode == "diloco":
            self.optimizer = torch.optim.SGD(self._global, lr=settings.outer_lr, momentum=settings.outer_momentum,
                                             nesterov=settings.outer_nesterov)
        else:  # local_sgd: G - mean(G - L) = mean(L)
            self.optimizer = torch.optim.SGD(self._global, lr=1.0)

    @property
    def _locals(self) -> list[torch.Tensor]:
        """This rank's pieces of the parameters, looked up each time (FSDP2 may move them)."""
        return [local(p) for p in self._params]

    @property
    def nbytes(self) -> int:
        """Bytes of one pseudo-gradient (what crosses replicas at each sync, per rank)."""
        return self._pseudo.numel() * self._pseudo.element_size()

    # -- registered state (the outer optimizer's)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    # -- the outer step's tensors, in the order the protocol asks for them

    @torch.no_grad()
    def begin_outer_step(self) -> None:
        for g, t in zip(self._global, self._locals):
            g.copy_(t)

    @torch.no_grad()
    def take_pseudo_gradient(self) -> None:
        offset = 0
        for g, t in zip(self._global, self._locals):
            n = t.numel()
            torch.sub(g.reshape(-1), t.reshape(-1).float(), out=self._pseudo[offset:offset + n])
            t.copy_(g)
            offset += n

    def reduce(self, sync: GradientSync, plan: RankPlan | None) -> SyncResult:
        """Average the pseudo-gradient across the sync's contributors into the work buffer
        (the pseudo-gradient itself stays for a retry). Sharded: each rank's shard with the
        same rank of the other replicas; replicated: the ranks split the vector (equal on
        every rank of the replica: no average inside it)."""
        self._work.copy_(self._pseudo)
        if self.sharded:
            return sync.reduce_across_(self._work, plan)
        return sync.reduce_(self._work, plan, in_replica=False)

    @torch.no_grad()
    def apply(self, lr_scale: float) -> None:
        offset = 0
        for g, t in zip(self._global, self._locals):
            n = t.numel()
            g.copy_(t)  # the global state: this rank's own, or the one a catch-up just adopted
            g.grad = self._work[offset:offset + n].view_as(g)
            offset += n
        scaled_step(self.optimizer, lr_scale)
        for g, t in zip(self._global, self._locals):
            g.grad = None
            t.copy_(g)


def scaled_step(optimizer: torch.optim.Optimizer, lr_scale: float) -> None:
    """One optimizer step with every group's learning rate × lr_scale (the quorum's sqrt or
    linear rule); the learning rates are the script's again afterwards."""
    groups = optimizer.param_groups
    base = [group["lr"] for group in groups]
    for group, lr in zip(groups, base):
        group["lr"] = lr * lr_scale
    try:
        optimizer.step()
    finally:
        for group, lr in zip(groups, base):
            group["lr"] = lr
