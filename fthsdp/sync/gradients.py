"""Gradient averaging for one step: inside the replica over Gloo, across replicas over FTAR.

HSDP-style: the replica's ranks sum their gradients (Gloo all-reduce) and average
them; rank k all-reduces shard k of that average over FTAR with rank k of every other
participating replica; the sum is divided by the number of contributing (healthy)
replicas; the ranks all-gather the shards. A behind replica contributes zeros.
Every rank runs the same Gloo calls whatever happened to its FTAR part -- even without a
plan (`plan=None`: the quorum answer did not fit this rank) -- so a failure never
desynchronises the replica: it only turns that rank's vote into "no".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

from ftar_kernels import FatalError, FtarEndpoint, RecoverableError
from fthsdp.errors import Fatal
from fthsdp.step.plan import RankPlan
from fthsdp.telemetry import Collectives, Kind

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    ok: bool
    reason: str = ""


class GradientSync:
    """One rank's reducer. `configure` follows quorum changes; `reduce_` works in place."""

    def __init__(self, endpoint: FtarEndpoint, rank: int, world_size: int, timeout_s: float,
                 process_group: dist.ProcessGroup | None = None, collectives: Collectives | None = None) -> None:
        self.endpoint, self.rank, self.world_size, self.timeout_s = endpoint, rank, world_size, timeout_s
        self.process_group = process_group
        #: records each collective's join and completion in the rank's telemetry ring
        self.collectives = collectives or Collectives(None, world_size)
        self._generation: int | None = None
        self._broken = ""

    def configure(self, plan: RankPlan) -> None:
        """(Re)build the FTAR ring when the quorum changed or the last one broke."""
        if self._generation == plan.quorum_id and not self._broken:
            return
        try:
            self.endpoint.configure(plan.ftar_group_id, plan.quorum_id, list(plan.ftar_members))
            self._generation, self._broken = plan.quorum_id, ""
        except RecoverableError as exc:
            self._generation, self._broken = plan.quorum_id, f"FTAR ring of quorum {plan.quorum_id}: {exc}"
            log.warning("rank %s: %s", self.rank, self._broken)
        except FatalError as exc:
            raise _fatal(exc) from exc

    def mark_broken(self, reason: str) -> None:
        self._broken = reason

    def reduce_(self, flat: torch.Tensor, plan: RankPlan | None) -> SyncResult:
        """Average `flat` (this rank's gradient, 1-D float) across the step's contributors, in place."""
        if plan is not None and plan.behind:  # the whole replica is behind: every rank skips this
            flat.zero_()
        elif self.world_size > 1:  # without a plan too: the other ranks are in this all-reduce
            token = self.collectives.join(Kind.ALL_REDUCE, flat.numel() * flat.element_size())
            dist.all_reduce(flat, group=self.process_group)
            self.collectives.done(token)
            flat.div_(self.world_size)
        padded = -(-flat.numel() // self.world_size) * self.world_size
        work = flat if padded == flat.numel() else torch.cat([flat, flat.new_zeros(padded - flat.numel())])
        shards = list(work.chunk(self.world_size))
        shard = shards[self.rank]
        result = self._cross_replica_(shard, plan)
        if self.world_size > 1:
            gathered = [torch.empty_like(s) for s in shards]
            token = self.collectives.join(Kind.ALL_GATHER, work.numel() * work.element_size())
            dist.all_gather(gathered, shard.contiguous(), group=self.process_group)
            self.collectives.done(token)
            torch.cat(gathered, out=work)
        if work is not flat:
            flat.copy_(work[:flat.numel()])
        return result

    def _cross_replica_(self, shard: torch.Tensor, plan: RankPlan | None) -> SyncResult:
        if plan is None:
            return SyncResult(False, "no plan for this step")
        if self._broken:
            return SyncResult(False, self._broken)
        token = self.collectives.join_ftar(plan.quorum_id, len(plan.ftar_members), shard.numel() * shard.element_size())
        try:
            self.endpoint.allreduce(shard).wait(self.timeout_s)
        except RecoverableError as exc:
            self._broken = f"FTAR all-reduce of step {plan.step} failed: {exc}"
            return SyncResult(False, self._broken)
        except FatalError as exc:
            raise _fatal(exc) from exc
        finally:
            self.collectives.done(token)
        shard.div_(plan.divisor)
        return SyncResult(True)


def _fatal(exc: FatalError) -> Fatal:
    return Fatal(f"FTAR failed for good on this rank: {exc}; exit so the replica is restarted (on another host "
                 f"if this one's device or network is broken)")


def flatten_grads(params: Iterable[torch.nn.Parameter], out: torch.Tensor | None = None) -> torch.Tensor:
    """Every parameter's gradient (zeros where none) in one float32 vector."""
    params = list(params)
    total = sum(p.numel() for p in params)
    if out is None or out.numel() != total:
        out = torch.empty(total, dtype=torch.float32)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            out[offset:offset + n].zero_()
        else:
            out[offset:offset + n].copy_(p.grad.reshape(-1))
        offset += n
    return out


def unflatten_grads_(params: Iterable[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        piece = flat[offset:offset + n].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = piece.clone()
        else:
            p.grad.copy_(piece)
        offset += n
