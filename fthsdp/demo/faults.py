"""Faults the diagnosis must find, as wrappers around real parts (applied through `Seams` or by
wrapping the optimizer); nothing in the runtime checks for them. Each one waits for `go()`
(the demo lets it loose by creating a file) and then misbehaves for the rest of the process's
life, the way a bad host does:

    NeverJoins(sync, go)          hangs outside collectives: never joins the step's all-reduce
    StallsInside(endpoint, go)    joins the FTAR all-reduce and never progresses
    Slow(sync, extra_s, go)       takes extra_s longer to get to the step's all-reduce (a slow GPU)
    FlipsBits(optimizer, go)      flips the lowest mantissa bit of one weight after each step:
                                  silent data corruption, too small to disturb training

Not a fault itself: HoldsInSync(endpoint, armed, holding, hold_s) stops (bounded) at the start of
an all-reduce -- in a semi-synchronous run, a sync's -- so that the demo's SIGKILL of the trainer
or its host lands in the sync (fthsdp/demo/run.py await_moment).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import torch

Go = Callable[[], bool]


class Delegate:
    """A wrapper around a part (a GradientSync, an endpoint, an optimizer) that passes every name
    it does not override to the part: the base of each fault here and of the tests' faults."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _hang() -> None:
    threading.Event().wait()  # until the agent stops the process


class NeverJoins(Delegate):
    """A GradientSync whose rank stops before the step's collectives."""

    def __init__(self, sync, go: Go) -> None:
        super().__init__(sync)
        self._go = go

    def reduce_(self, flat, plan):
        if self._go():
            _hang()
        return self._inner.reduce_(flat, plan)


class Slow(Delegate):
    """A GradientSync whose rank arrives `extra_s` late to every step's collectives."""

    def __init__(self, sync, extra_s: float, go: Go) -> None:
        super().__init__(sync)
        self._extra_s, self._go = extra_s, go

    def reduce_(self, flat, plan):
        if self._go():
            time.sleep(self._extra_s)
        return self._inner.reduce_(flat, plan)


class _Stuck:
    def wait(self, timeout_s: float | None = None):
        _hang()


class StallsInside(Delegate):
    """An FTAR endpoint whose all-reduce is joined (recorded) and never moves."""

    def __init__(self, endpoint, go: Go) -> None:
        super().__init__(endpoint)
        self._go = go

    def allreduce(self, tensor):
        if self._go():
            return _Stuck()
        return self._inner.allreduce(tensor)


class FlipsBits(Delegate):
    """An optimizer whose host corrupts one weight after every step (bit 0 of element 0 of
    the first parameter: the digest changes, the training does not notice)."""

    def __init__(self, optimizer: torch.optim.Optimizer, go: Go) -> None:
        super().__init__(optimizer)
        self._go = go

    def step(self, *args, **kwargs):
        out = self._inner.step(*args, **kwargs)
        if self._go():
            with torch.no_grad():
                first = self._inner.param_groups[0]["params"][0]
                bits = first.view(-1).view(torch.int32)
                bits[0] ^= 1
        return out


class HoldsInSync(Delegate):
    """An FTAR endpoint that, when `armed()`, says so (`holding()`) at the start of an all-reduce
    and waits up to `hold_s` before it starts (the demo kills the process meanwhile)."""

    def __init__(self, endpoint, armed: Go, holding: Callable[[], None], hold_s: float) -> None:
        super().__init__(endpoint)
        self._armed, self._holding, self._hold_s = armed, holding, hold_s

    def allreduce(self, tensor):
        if self._armed():
            self._holding()
            threading.Event().wait(self._hold_s)
        return self._inner.allreduce(tensor)
