"""What the coordinator sent, as the rank protocol's events (frames in, events out; no I/O).

A plan frame becomes PlanArrived with this rank's plan (or the reason none could be derived),
or ResumeOrdered on a rollback quorum; the address book keeps the addresses a later quorum
may omit. A quorum of a controller whose sync mode is not this rank's is refused for good
(PlanRefused FATAL, naming both).
"""

from __future__ import annotations

from fthsdp.settings import RuntimeSettings
from fthsdp.step import events as ev
from fthsdp.step.plan import AddressBook, PlanError, plan_for_rank
from protos import replica_pb2 as rpb
from protos import sync_modes

_REFUSALS = {rpb.NoPlan.RETRY: ev.Refusal.RETRY, rpb.NoPlan.FINISHED: ev.Refusal.FINISHED,
             rpb.NoPlan.FATAL: ev.Refusal.FATAL}


def event_of(kind: str, message, book: AddressBook, s: RuntimeSettings) -> ev.Event:
    """The event of one frame the rank's channel received (`kind` as CoordinatorClient.receive names it)."""
    translate = _EVENT_OF.get(kind)
    if translate is None:
        raise ValueError(f"a coordinator frame of kind {kind!r} is not an answer in the step protocol")
    return translate(message, book, s)


def planned_step(event: ev.Event) -> int | None:
    """The step an answer to a begin plans (the plan's own step: a behind replica's source's),
    None for an event that answers no begin."""
    if isinstance(event, ev.PlanArrived) and event.plan is not None:
        return event.plan.step
    if isinstance(event, (ev.PlanArrived, ev.ResumeOrdered, ev.PlanRefused)):
        return event.step
    return None


def _no_plan(message: rpb.NoPlan, _book: AddressBook, _s: RuntimeSettings) -> ev.PlanRefused:
    return ev.PlanRefused(message.attempt, _REFUSALS[message.kind], message.reason, message.step)


def _decision(message: rpb.StepDecision, _book: AddressBook, _s: RuntimeSettings) -> ev.DecisionArrived:
    return ev.DecisionArrived(message.attempt, message.outcome == rpb.StepDecision.COMMIT, message.reason)


def _finished(message, _book: AddressBook, _s: RuntimeSettings) -> ev.FinishedArrived:
    return ev.FinishedArrived(message.clean, message.reason)


def _plan_arrived(message: rpb.StepPlan, book: AddressBook,
                  s: RuntimeSettings) -> ev.PlanArrived | ev.ResumeOrdered | ev.PlanRefused:
    q = message.quorum
    if refused := sync_modes.mismatch(q.sync_mode, q.sync_every_steps, s.sync_mode, s.sync_every_steps,
                                      q.sync_fragments, s.sync_fragments):
        return ev.PlanRefused(message.attempt, ev.Refusal.FATAL, refused, message.step)
    if message.quorum.HasField("resume_checkpoint_step"):  # the coordinator orders a resume
        try:
            book.fill(message)  # the next quorum may omit the addresses this frame carries
        except PlanError:
            pass  # no plan is derived from this quorum
        return ev.ResumeOrdered(message.attempt, message.step, message.quorum.quorum_id,
                                message.quorum.resume_checkpoint_step)
    try:
        addresses = book.fill(message)
        plan = plan_for_rank(message.quorum, addresses, s.job_id, s.replica_id, s.rank, s.digest_every_steps)
    except PlanError as exc:
        return ev.PlanArrived(message.attempt, message.step, None, str(exc))
    return ev.PlanArrived(message.attempt, message.step, plan)


#: one translator per frame kind (CoordinatorClient.receive's names)
_EVENT_OF = {"plan": _plan_arrived, "no_plan": _no_plan, "decision": _decision, "finished": _finished}
