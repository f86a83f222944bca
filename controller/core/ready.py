"""Ready: everything one step of the controller's core asks the shell to do, as a value.

The shell's rule, in this order: write `writes` (compare-and-set, one value per section);
only then deliver `orders` and send `answer` (and, when `quorum` formed, the quorum's answer
to its members); then write `writes_behind`. One function applies it:
`ControllerServer.execute` (controller/service/server.py). A write that fails is told back to the core as
`WriteFailed(sections)`, and the answer is refused instead of sent: nothing leaves the
controller that a successor could not find in the store. `events` go to the event log at
once (they are telemetry; their durable copy is the journal section).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.goodput import Observation
from controller.core.model import Event, OrderOut, Quorum


@dataclass(frozen=True)
class Ready:
    #: what the command returns to its caller (None when it returns nothing)
    answer: object = None
    #: store sections to write before any answer or order goes out (controller.core.pending_writes)
    writes: tuple[str, ...] = ()
    #: store sections to write after answering (the journal, repeated registrations)
    writes_behind: tuple[str, ...] = ()
    #: orders for agents, delivered once `writes` are durable
    orders: tuple[OrderOut, ...] = ()
    events: tuple[Event, ...] = ()
    #: goodput observations for the histograms
    observations: tuple[Observation, ...] = ()
    #: the quorum this step formed (its members' waiting joins are answered with it)
    quorum: Quorum | None = None
    #: how long the round that formed `quorum` was open (from its first join)
    quorum_wait_s: float | None = None
    #: when the core wants a Tick at the latest (None: the ticker's own period)
    wake_at: float | None = None
    #: after a look at the round (CloseRound, Tick): the replicas still in it, with why each
    #: other replica is not (joins waiting outside it are refused); None: not looked at
    round_members: frozenset[str] | None = None

    @property
    def durable_first(self) -> bool:
        """Whether something must be written before the answer may go out."""
        return bool(self.writes)


__all__ = ["Ready"]
