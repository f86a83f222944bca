"""The Manager's executor is a table: every effect of the step protocol has one handler, and
every frame kind one translation into an event (no processes)."""

from __future__ import annotations

import typing

import pytest

from fthsdp import manager
from fthsdp.step import events as ev, frames
from fthsdp.step.plan import AddressBook
from protos import replica_pb2 as rpb
from tests.runtime.protocol_helpers import SETTINGS, plan


def test_every_effect_of_the_protocol_has_exactly_one_handler_in_the_table():
    effects = set(typing.get_args(ev.Effect))
    assert set(manager._EFFECTS) == effects
    assert all(callable(handler) for handler in manager._EFFECTS.values())


def test_a_fail_effect_raises_the_error_its_kind_names():
    from fthsdp.errors import Fatal, RetryLimitExceeded
    with pytest.raises(RetryLimitExceeded, match="three times"):
        manager._EFFECTS[ev.Fail](None, ev.Fail("three times", retries_exhausted=True))
    with pytest.raises(Fatal, match="gone"):
        manager._EFFECTS[ev.Fail](None, ev.Fail("gone"))


@pytest.mark.parametrize("kind, message, event", [
    ("no_plan", rpb.NoPlan(attempt=4, step=7, kind=rpb.NoPlan.RETRY, reason="slow"),
     ev.PlanRefused(4, ev.Refusal.RETRY, "slow", 7)),
    ("decision", rpb.StepDecision(attempt=4, outcome=rpb.StepDecision.COMMIT, reason="all yes"),
     ev.DecisionArrived(4, True, "all yes")),
    ("finished", rpb.ReplicaFinished(clean=True, reason="bye"), ev.FinishedArrived(True, "bye")),
])
def test_each_frame_kind_has_one_translation(kind, message, event):
    assert frames.event_of(kind, message, AddressBook(), SETTINGS) == event


def test_a_frame_kind_that_is_no_step_answer_is_refused_by_name():
    with pytest.raises(ValueError, match="'welcome'"):
        frames.event_of("welcome", rpb.Welcome(), AddressBook(), SETTINGS)


def test_the_planned_step_is_the_plans_own_for_a_plan_and_the_begins_otherwise():
    behind = plan(9, behind=True)
    assert frames.planned_step(ev.PlanArrived(1, 3, behind)) == 9
    assert frames.planned_step(ev.PlanArrived(1, 3, None, "no address")) == 3
    assert frames.planned_step(ev.ResumeOrdered(1, 3, 5, 7)) == 3
    assert frames.planned_step(ev.PlanRefused(1, ev.Refusal.RETRY, "slow", 3)) == 3
    assert frames.planned_step(ev.DecisionArrived(1, True, "")) is None
