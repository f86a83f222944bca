"""The semi-synchronous effects of the step protocol, executed on a rank's OuterSync.

The Manager (fthsdp/manager.py) runs every effect the pure protocol returns through its
`_EFFECTS` table; the effects of inner steps and syncs -- local_sgd, diloco and
streaming_diloco, with or without an overlapped sync -- are these handlers, which only move
the tensors fthsdp/sync/outer.py owns. Each takes the Manager and the effect and returns the
event to feed next (a reduce's Reduced), or None.
"""

from __future__ import annotations

from typing import Any, Callable

from fthsdp.step import events as ev
from fthsdp.sync.gradients import SyncResult


def _reduced(result: SyncResult | None) -> ev.Reduced | None:
    return None if result is None else ev.Reduced(result.ok, result.reason)


def _begin_inner(m: Any, e: ev.BeginInner) -> None:
    if e.index == 0:
        m.outer.begin_outer_step()


def _inner_step(m: Any, e: ev.InnerStep) -> None:
    m.optimizer.step()


def _take_pseudo_gradient(m: Any, e: ev.TakePseudoGradient) -> None:
    m.outer.take_pseudo_gradient(e.fragment, e.keep_local)


def _reduce_pseudo_gradient(m: Any, e: ev.ReducePseudoGradient) -> ev.Reduced | None:
    m.plans_in_at_due += e.planned_ahead
    return _reduced(m.outer.reduce(m.sync, e.plan, e.fragment))


def _start_reduce(m: Any, e: ev.StartReduce) -> ev.Reduced | None:
    """In flight: Reduced now only when it failed at once; else the Manager polls it."""
    return _reduced(m.outer.start_reduce(m.sync, e.plan, e.fragment))


def _await_reduce(m: Any, e: ev.AwaitReduce) -> ev.Reduced | None:
    return _reduced(m.outer.poll_reduce(m.sync, wait=True))


def _gather_reduced(m: Any, e: ev.GatherReduced) -> None:
    m.outer.gather(m.sync)


def _drop_reduce(m: Any, e: ev.DropReduce) -> None:
    m.outer.drop_reduce(m.sync)
    m.sync.mark_broken(e.reason)  # the next attempt rebuilds the ring, which cancels the old all-reduce


def _apply_outer_step(m: Any, e: ev.ApplyOuterStep) -> None:
    """A sync's commit: the outer optimizer of its fragment, outer_lr × the quorum's lr_scale."""
    m.outer.apply(e.plan.lr_scale if m.settings.apply_lr_scale else 1.0, e.fragment)
    if m.registry.rng is not None:
        m.registry.rng.advance()


#: effect type -> handler(manager, effect) -> the event to feed next, or None
OUTER_EFFECTS: dict[type, Callable[[Any, Any], ev.Event | None]] = {
    ev.BeginInner: _begin_inner,
    ev.InnerStep: _inner_step,
    ev.TakePseudoGradient: _take_pseudo_gradient,
    ev.ReducePseudoGradient: _reduce_pseudo_gradient,
    ev.StartReduce: _start_reduce,
    ev.AwaitReduce: _await_reduce,
    ev.GatherReduced: _gather_reduced,
    ev.DropReduce: _drop_reduce,
    ev.ApplyOuterStep: _apply_outer_step,
}
