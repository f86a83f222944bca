"""A semi-synchronous replica's tensors: the global parameters, the pseudo-gradient, the outer step.

In `local_sgd`, `diloco` and `streaming_diloco` modes (RuntimeSettings.sync_mode) a replica
trains *inner* steps on its own group, then meets the others at a *sync*: one step of the
ordinary protocol whose "gradient" is a pseudo-gradient. The protocol
(fthsdp/step/protocol.py) decides when each of these happens and which fragment a sync
carries; this class only moves tensors:

    begin_outer_step()            local_sgd / diloco: the model holds the global state G (a
                                  commit or a catch-up left it there): keep a copy of it
    ...inner steps change the model to L (the script's inner optimizer)...
    take_pseudo_gradient(f)       pseudo_f = G_f - L_f (kept for every attempt of the sync); the
                                  fragment's model tensors go back to G_f, so the state served to
                                  a catch-up is the global one there (with an overlap they keep
                                  training: keep_local)
    reduce(sync, plan, f)         average fragment f's pseudo-gradient over the sync's
                                  contributors (a behind replica adds zeros), into a work buffer;
                                  cast to sync_wire_dtype for the FTAR all-reduce, back after it
    start_reduce(sync, plan, f)   the same in the background while the trainer trains on
                                  (streaming_diloco's overlap): GradientSync.finish_across polls
                                  it, GradientSync.gather completes it at the due step
    apply(lr_scale, f)            G_f := outer_step_f(G_f, average): SGD with outer_lr × lr_scale,
                                  outer_momentum, Nesterov (diloco, streaming), or G - average,
                                  i.e. the mean of the replicas' L (local_sgd); the fragment's
                                  model tensors take G_f

Fragments (`fragments_of`): the parameters in their order, cut into sync_fragments contiguous
runs of about equal size (by each parameter's full element count, so every rank and every
replica cuts the same way, sharded or not). local_sgd and diloco have one fragment, the whole
model. In streaming_diloco each fragment has its own outer optimizer, and G lives on between
its syncs (the model is G only in the fragment just synced): G is then part of the registered
state, so it travels with catch-up and checkpoints and is digested instead of the model.

The outer optimizers run on copies of this rank's local tensors (its shards when the model is
FSDP2-sharded), so it is the same code for every layout; their state is registered state
(`OUTER_STATE_NAME`): it travels with catch-up and checkpoints and is digested. Every replica
applies the same bytes (the FTAR result) to the same G with the same outer state, so after a
committed sync the global state is bitwise equal everywhere. The inner optimizer's state is
per replica by design (not digested); a catch-up takes its source's.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from fthsdp.settings import RuntimeSettings
from fthsdp.state.shards import local
from fthsdp.step.plan import RankPlan
from fthsdp.sync.gradients import CrossReduce, GradientSync, SyncResult

#: the outer optimizer's name among the registered state
OUTER_STATE_NAME = "fthsdp.outer_optimizer"

_WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def fragments_of(sizes: Sequence[int], count: int) -> list[range]:
    """Cut parameters of these element counts, in order, into `count` contiguous runs of about
    equal total size (each run at least one parameter): the runs' parameter indices. Pure and
    deterministic: every rank and replica computes the same cut from the same model."""
    if not 1 <= count <= len(sizes):
        raise ValueError(f"sync_fragments={count} needs between 1 and the model's {len(sizes)} trainable "
                         f"parameters: lower sync_fragments (FTHSDP_SYNC_FRAGMENTS)")
    total, runs, start, done = sum(sizes), [], 0, 0
    for f in range(1, count):
        end, goal = start + 1, total * f / count  # at least one parameter each
        done += sizes[start]
        while end < len(sizes) - (count - f) and done + sizes[end] / 2 <= goal:
            done += sizes[end]
            end += 1
        runs.append(range(start, end))
        start = end
    runs.append(range(start, len(sizes)))
    return runs


class OuterSync:
    """One rank's global copy, pseudo-gradient and outer optimizers (allocated here, no threads)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], settings: RuntimeSettings, sharded: bool) -> None:
        self.settings, self.sharded = settings, sharded
        self.streaming = settings.sync_mode == "streaming_diloco"
        self.wire_dtype = _WIRE_DTYPES[settings.sync_wire_dtype]
        self._params = list(params)
        self.fragments = fragments_of([p.numel() for p in self._params], settings.sync_fragments)
        with torch.no_grad():
            self._global = [torch.nn.Parameter(t.to(torch.float32, copy=True)) for t in self._locals]
        offsets = [0]
        for g in self._global:
            offsets.append(offsets[-1] + g.numel())
        #: each fragment's slice of the flat pseudo-gradient (its parameters are contiguous)
        self._slices = [slice(offsets[r.start], offsets[r.stop]) for r in self.fragments]
        device = self._global[0].device if self._global else torch.device("cpu")
        self._pseudo = torch.zeros(offsets[-1], dtype=torch.float32, device=device)
        self._work = torch.zeros_like(self._pseudo)
        self._pending: CrossReduce | None = None  # a reduce started in the background (start_reduce)
        self.optimizers = [self._outer_optimizer([self._global[i] for i in r]) for r in self.fragments]

    def _outer_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        s = self.settings
        if s.sync_mode == "local_sgd":  # G - mean(G - L) = mean(L)
            return torch.optim.SGD(params, lr=1.0)
        return torch.optim.SGD(params, lr=s.outer_lr, momentum=s.outer_momentum, nesterov=s.outer_nesterov)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The outer optimizer of the whole model (local_sgd, diloco: one fragment)."""
        return self.optimizers[0]

    @property
    def _locals(self) -> list[torch.Tensor]:
        """This rank's pieces of the parameters, looked up each time (FSDP2 may move them)."""
        return [local(p) for p in self._params]

    @property
    def nbytes(self) -> int:
        """Bytes this rank puts on the cross-replica wire per sync_every_steps inner steps: the
        whole pseudo-gradient in sync_wire_dtype (one sync of it, or F syncs of a fragment each)."""
        return self._pseudo.numel() * self.wire_dtype.itemsize

    def fragment_nbytes(self, fragment: int) -> int:
        """Bytes of one sync of `fragment` on the wire (this rank's part)."""
        return self._pseudo[self._slices[fragment]].numel() * self.wire_dtype.itemsize

    # -- registered state (the outer optimizers', and in streaming the global copy)

    def state_dict(self) -> dict[str, Any]:
        if not self.streaming:
            return self.optimizer.state_dict()
        return {"fragments": len(self.fragments), "global": [g.detach() for g in self._global],
                "outer": [o.state_dict() for o in self.optimizers]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.streaming:
            self.optimizer.load_state_dict(state)
            return
        if state.get("fragments") != len(self.fragments) or len(state.get("global", ())) != len(self._global):
            raise ValueError(f"the outer state holds {state.get('fragments')!r} fragment(s) of "
                             f"{len(state.get('global', ()))} parameters, this rank syncs {len(self.fragments)} of "
                             f"{len(self._global)} (sync_fragments and the model must be the same everywhere)")
        for g, saved in zip(self._global, state["global"]):
            g.copy_(saved)
        for o, saved in zip(self.optimizers, state["outer"]):
            o.load_state_dict(saved)

    # -- the outer step's tensors, in the order the protocol asks for them

    @torch.no_grad()
    def begin_outer_step(self) -> None:
        if self.streaming:  # G lives on between fragment syncs (set at start, by a catch-up or a checkpoint)
            return
        for g, t in zip(self._global, self._locals):
            g.copy_(t)

    @torch.no_grad()
    def take_pseudo_gradient(self, fragment: int = 0, keep_local: bool = False) -> None:
        locals_ = self._locals
        offset = self._slices[fragment].start
        for i in self.fragments[fragment]:
            g, t = self._global[i], locals_[i]
            n = t.numel()
            torch.sub(g.reshape(-1), t.reshape(-1).float(), out=self._pseudo[offset:offset + n])
            if not keep_local:
                t.copy_(g)
            offset += n

    def reduce(self, sync: GradientSync, plan: RankPlan | None, fragment: int = 0) -> SyncResult:
        """Average fragment `fragment`'s pseudo-gradient across the sync's contributors into the
        work buffer (the pseudo-gradient itself stays for a retry). Sharded: each rank's shard
        with the same rank of the other replicas; replicated: the ranks split the vector (equal
        on every rank of the replica: no average inside it)."""
        work = self._work_of(fragment)
        if self.sharded:
            return sync.reduce_across_(work, plan, self.wire_dtype)
        return sync.reduce_(work, plan, in_replica=False, wire_dtype=self.wire_dtype)

    def start_reduce(self, sync: GradientSync, plan: RankPlan, fragment: int) -> SyncResult | None:
        """`reduce` started in the background, with no collective inside the replica: a sharded
        rank's own piece, or a replicated rank's 1/world_size of the vector (`gather` joins the
        pieces at the commit). What travels is a copy, so an abandoned all-reduce never writes
        into the work buffer a later attempt uses. Its result when it failed at once, else None."""
        self._pending = sync.start_across(self._work_of(fragment), plan, self.wire_dtype, split=not self.sharded,
                                          own_buffer=True)
        return self._pending.result

    def poll_reduce(self, sync: GradientSync, wait: bool) -> SyncResult | None:
        """The started reduce's result: None while it runs (`wait`: at most the FTAR timeout)."""
        assert self._pending is not None
        return sync.finish_across(self._pending, wait)

    @property
    def pending_reduce(self) -> CrossReduce | None:
        """The reduce started in the background, until it is gathered or dropped."""
        return self._pending

    def wake_when_reduced(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the started reduce ended (at once when it has, or never ran):
        streaming_diloco's flight waker (fthsdp/step/flight_waker.py) waits on it."""
        handle = self._pending.handle if self._pending is not None else None
        if handle is None:
            callback()
        else:
            handle.add_done_callback(callback)

    def gather(self, sync: GradientSync) -> None:
        """The commit of a started reduce: its pieces joined in the work buffer (`apply` reads it)."""
        pending, self._pending = self._pending, None
        assert pending is not None
        sync.gather(pending)

    def drop_reduce(self, sync: GradientSync) -> None:
        """Forget a started reduce (a retry or a close): one still running is closed in the
        telemetry ring (its FTAR join is abandoned, not hung; the next ring cancels it)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.result is None:
            sync.collectives.done(pending.token)

    def _work_of(self, fragment: int) -> torch.Tensor:
        part = self._slices[fragment]
        work = self._work[part]
        work.copy_(self._pseudo[part])
        return work

    @torch.no_grad()
    def apply(self, lr_scale: float, fragment: int = 0) -> None:
        locals_ = self._locals
        offset = self._slices[fragment].start
        for i in self.fragments[fragment]:
            g, t = self._global[i], locals_[i]
            n = t.numel()
            if not self.streaming:
                g.copy_(t)  # the global state: this rank's own, or the one a catch-up just adopted
            g.grad = self._work[offset:offset + n].view_as(g)
            offset += n
        scaled_step(self.optimizers[fragment], lr_scale)
        for i in self.fragments[fragment]:
            g = self._global[i]
            g.grad = None
            locals_[i].copy_(g)

    def global_tensors(self) -> list[torch.Tensor]:
        """This rank's global copy (for checks: bitwise equal on every replica after a sync)."""
        return [g.detach() for g in self._global]

    @torch.no_grad()
    def load_global(self) -> None:
        """The model takes the global copy, every fragment (streaming_diloco at close: what the
        script saves afterwards is the global model, not the replica's own inner steps)."""
        for g, t in zip(self._global, self._locals):
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
