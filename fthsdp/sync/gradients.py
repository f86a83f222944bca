"""Gradient averaging for one step: inside the replica, then across replicas over FTAR.

Two ways in, one ring:

- Sharded models (FSDP2): FSDP reduce-scatters each parameter group inside the replica and
  hands this rank's shard to `reduce_shard_` (fthsdp/sync/fsdp.py installs the hook). The
  shard is all-reduced over FTAR with rank k of every other contributing replica, divided by
  their number; 16-bit shards travel and add as float32 and are rounded once at the end. A
  deferred shard's reduction overlaps the rest of backward; `wait_shards` (before the
  optimizer step) waits for all of them. No full-size gradient buffer exists anywhere.
- Replicated models (plain or DDP): `reduce_` takes a flat buffer (all gradients, or one DDP
  bucket) on the gradients' device: the replica's ranks average it (all-reduce on the
  replica's process group), rank k all-reduces shard k over FTAR, and the ranks all-gather.

A behind replica contributes zeros. Every rank runs the same in-replica collectives whatever
happened to its FTAR part -- even without a plan (`plan=None`: the quorum answer did not fit
this rank) -- so a failure never desynchronises the replica: it only turns that rank's vote
into "no".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.distributed as dist

from ftar_kernels import AllReduceHandle, FatalError, FtarEndpoint, RecoverableError
from fthsdp.errors import Fatal
from fthsdp.step.plan import RankPlan
from fthsdp.telemetry import Collectives, Kind

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    ok: bool
    reason: str = ""


@dataclass
class _Shard:
    """One gradient shard on its way through FTAR: `work` is what travels (the shard itself,
    or its float32 copy when the shard is 16-bit)."""
    shard: torch.Tensor
    work: torch.Tensor
    handle: AllReduceHandle


@dataclass
class CrossReduce:
    """One cross-replica average under way: `start_across` → `finish_across` → `gather`.
    `shard` (this rank's part of `work`) is what is averaged with the same rank of the other
    contributors; `work` is `flat`, or a padded copy of it when the replica's ranks split it."""
    plan: RankPlan | None
    flat: torch.Tensor
    work: torch.Tensor
    shard: torch.Tensor
    split: bool
    wire: torch.Tensor | None = None
    handle: AllReduceHandle | None = None
    token: object = None
    result: SyncResult | None = None


@dataclass
class _ShardStep:
    pending: list[_Shard] = field(default_factory=list)
    count: int = 0
    failure: str = ""


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
        self._shards = _ShardStep()

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
        """The step's gradients are dropped: forget its shards; the next attempt rebuilds the ring."""
        self._broken = reason
        self._shards = _ShardStep()

    # -- sharded models (FSDP2)

    def reduce_shard_(self, shard: torch.Tensor, plan: RankPlan | None, deferred: bool) -> None:
        """Start averaging one reduce-scatter output across replicas, in place. Finished here
        unless `deferred` (then `wait_shards` finishes it)."""
        step = self._shards
        step.count += 1
        if plan is None:
            step.failure = step.failure or "no plan for this step"
            return
        if plan.behind:
            shard.zero_()
        if self._broken or step.failure:  # a broken ring cannot carry this one either
            step.failure = step.failure or self._broken
            return
        work = shard if shard.dtype == torch.float32 else shard.float()
        try:
            item = _Shard(shard, work, self.endpoint.allreduce(work))
        except FatalError as exc:
            raise _fatal(exc) from exc
        if deferred:
            step.pending.append(item)
        else:
            self._finish_shard(item, plan)

    def wait_shards(self, plan: RankPlan | None) -> SyncResult:
        """Wait for every deferred shard of this step (each wait bounded by timeout_s)."""
        step, self._shards = self._shards, _ShardStep()
        for item in step.pending:
            if not step.failure:
                self._finish_shard(item, plan, step)
        if not step.count:
            step.failure = step.failure or ("no gradient shard reached the all-reduce hook this step: run "
                                            "backward through the FSDP-wrapped model before ending the step")
        return SyncResult(not step.failure, step.failure)

    def _finish_shard(self, item: _Shard, plan: RankPlan | None, step: _ShardStep | None = None) -> None:
        step = step or self._shards
        assert plan is not None
        try:
            item.handle.wait(self.timeout_s)
        except RecoverableError as exc:
            self._broken = f"FTAR all-reduce of step {plan.step} failed: {exc}"
            step.failure = step.failure or self._broken
            return
        except FatalError as exc:
            raise _fatal(exc) from exc
        if item.work.is_cuda and item.work is not item.shard:
            # allocated on FSDP's reduce stream, used here on this one: not reused before we are done
            item.work.record_stream(torch.cuda.current_stream(item.work.device))
        item.work.div_(plan.divisor)
        if item.work is not item.shard:
            item.shard.copy_(item.work)  # the one rounding back to 16 bits

    # -- replicated models (plain, DDP)

    def reduce_(self, flat: torch.Tensor, plan: RankPlan | None, in_replica: bool = True,
                wire_dtype: torch.dtype | None = None) -> SyncResult:
        """Average `flat` (this rank's gradient, 1-D float) across the step's contributors, in place.
        `in_replica=False`: `flat` is equal on every rank of the replica already (a replicated
        model's pseudo-gradient): it is not averaged inside the replica, only split and gathered.
        `wire_dtype`: the dtype this rank's shard crosses replicas in (see `start_across`)."""
        if plan is not None and plan.behind:  # the whole replica is behind: every rank skips this
            flat.zero_()
        elif self.world_size > 1 and in_replica:  # without a plan too: the other ranks are in this all-reduce
            token = self.collectives.join(Kind.ALL_REDUCE, flat.numel() * flat.element_size())
            dist.all_reduce(flat, group=self.process_group)
            self.collectives.done(token)
            flat.div_(self.world_size)
        pending = self.start_across(flat, plan, wire_dtype, split=True)
        result = self.finish_across(pending)
        self.gather(pending)
        return result

    def reduce_across_(self, flat: torch.Tensor, plan: RankPlan | None,
                       wire_dtype: torch.dtype | None = None) -> SyncResult:
        """Average this rank's own piece (a shard's pseudo-gradient) with the same rank of the
        other contributors only, in place (a behind replica contributes zeros)."""
        return self.finish_across(self.start_across(flat, plan, wire_dtype))

    def start_across(self, flat: torch.Tensor, plan: RankPlan | None, wire_dtype: torch.dtype | None = None, *,
                     split: bool = False, own_buffer: bool = False) -> CrossReduce:
        """Start averaging across replicas, with no collective inside the replica: all of `flat`
        (this rank's own piece), or with `split` this rank's 1/world_size of it (`flat` is equal on
        every rank of the replica; `gather` puts the pieces together). With a `wire_dtype` other
        than the piece's, a copy in that dtype travels and is summed (bfloat16: half the bytes)
        and the sum is cast back: every contributor gets the same bytes, so the result is equal
        everywhere; the division happens after, in the piece's dtype. `own_buffer`: a copy
        travels whatever the dtype, so an abandoned all-reduce never writes into `flat`. A behind
        replica contributes zeros."""
        if plan is not None and plan.behind:
            flat.zero_()
        work = flat
        if split:
            padded = -(-flat.numel() // self.world_size) * self.world_size
            work = flat if padded == flat.numel() else torch.cat([flat, flat.new_zeros(padded - flat.numel())])
        shard = work.chunk(self.world_size)[self.rank] if split else work
        pending = CrossReduce(plan, flat, work, shard, split)
        if plan is None:
            pending.result = SyncResult(False, "no plan for this step")
        elif self._broken:
            pending.result = SyncResult(False, self._broken)
        if pending.result is not None:
            return pending
        dtype = wire_dtype or shard.dtype
        pending.wire = shard.to(dtype, copy=True) if own_buffer or dtype != shard.dtype else shard
        pending.token = self.collectives.join_ftar(plan.quorum_id, len(plan.ftar_members),
                                                   pending.wire.numel() * pending.wire.element_size())
        try:
            pending.handle = self.endpoint.allreduce(pending.wire)
        except FatalError as exc:
            self.collectives.done(pending.token)
            raise _fatal(exc) from exc
        return pending

    def finish_across(self, pending: CrossReduce, wait: bool = True) -> SyncResult | None:
        """The result of `start_across` (waited for at most timeout_s), divided by the
        contributors into its piece; None while it still runs and not `wait`."""
        if pending.result is not None:
            return pending.result
        assert pending.handle is not None and pending.wire is not None and pending.plan is not None
        if not wait and not pending.handle.done():
            return None
        try:
            pending.handle.wait(self.timeout_s)
        except RecoverableError as exc:
            self._broken = f"FTAR all-reduce of step {pending.plan.step} failed: {exc}"
            pending.result = SyncResult(False, self._broken)
            return pending.result
        except FatalError as exc:
            raise _fatal(exc) from exc
        finally:
            self.collectives.done(pending.token)
        if pending.wire is not pending.shard:
            pending.shard.copy_(pending.wire)
        pending.shard.div_(pending.plan.divisor)
        pending.result = SyncResult(True)
        return pending.result

    def gather(self, pending: CrossReduce) -> None:
        """A split average: the replica's ranks all-gather their pieces into `flat` (every rank
        of the replica, whatever its own piece's result, so the ranks stay in one order)."""
        if not pending.split:
            return
        work = pending.work
        if self.world_size > 1:
            shards = list(work.chunk(self.world_size))
            gathered = [torch.empty_like(s) for s in shards]
            token = self.collectives.join(Kind.ALL_GATHER, work.numel() * work.element_size())
            dist.all_gather(gathered, pending.shard.contiguous(), group=self.process_group)
            self.collectives.done(token)
            torch.cat(gathered, out=work)
        if work is not pending.flat:
            pending.flat.copy_(work[:pending.flat.numel()])


def _fatal(exc: FatalError) -> Fatal:
    return Fatal(f"FTAR failed for good on this rank: {exc}; exit so the replica is restarted (on another host "
                 f"if this one's device or network is broken)")


def flatten_grads(params: Iterable[torch.nn.Parameter], out: torch.Tensor | None = None) -> torch.Tensor:
    """Every parameter's gradient (zeros where none) in one float32 vector on their device."""
    params = list(params)
    total = sum(p.numel() for p in params)
    device = params[0].device if params else torch.device("cpu")
    if out is None or out.numel() != total or out.device != device:
        out = torch.empty(total, dtype=torch.float32, device=device)
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
