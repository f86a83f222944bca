"""Resuming from a durable checkpoint on a rollback quorum, in the pure cores (fake clock, no I/O):
the coordinator turns the controller's offer into one order for every rank, each rank loads the
checkpoint and begins its step, and step reports carry the newest checkpoint rank 0 saved."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.data_ledger import DataLedger
from fthsdp.step import coordination as co
from fthsdp.step import events as ev
from fthsdp.step.protocol import Phase, ProtocolError
from tests.runtime.protocol_helpers import SETTINGS, Run, answer, plan, state
from tests.runtime.test_coordination import Core, frames, vote

CKPT = dataclasses.replace(SETTINGS, checkpoint_dir="/ckpt", checkpoint_every_steps=4).validate()
CORE = dataclasses.replace(CKPT, world_size=3, digest_every_steps=0)


def planned(core: Core, step: int, offered: int | None, quorum_id: int = 9) -> list:
    """Every rank begins `step`; the controller answers with both members at it (a rollback
    quorum when it offers checkpoint `offered`)."""
    (request,) = core.begin_all(step)
    assert isinstance(request, co.RequestQuorum)
    quorum = answer(max_step=step, members=(("a", step, True), ("b", step, True)), recover=(), quorum_id=quorum_id)
    if offered is not None:
        quorum.resume_checkpoint_step = offered
    return core.feed(co.QuorumAnswered(quorum))


# ---------------------------------------------------------------- the rank


def test_a_resume_order_loads_the_checkpoint_then_begins_its_step():
    run = Run(state(0, CKPT))
    run(ev.Begin())
    assert run(ev.ResumeOrdered(1, 0, 12, 40)) == (ev.StopServing(), ev.LoadCheckpoint(41))
    assert (run.state.phase, run.state.attempt, run.state.quorum_id) == (Phase.RESUMING, 1, 12)
    ledger = DataLedger({"a": 41, "b": 41})
    assert run(ev.CheckpointLoaded(41, ledger)) == ()
    assert (run.state.phase, run.state.step, run.state.ledger) == (Phase.IDLE, 41, ledger)
    assert run(ev.Begin()) == (ev.ServeState(41), ev.SendBegin(41))
    assert run.state.failures_in_a_row == 0  # a resume is no failed attempt


@pytest.mark.parametrize("loaded, reason", [
    (ev.CheckpointLoaded(-1, None, "checkpoint /ckpt/step-0000000041 fails its checksum"), "fails its checksum"),
    (ev.CheckpointLoaded(38, DataLedger({"a": 38})), "it holds the state at step 38, not at step 41"),
])
def test_a_checkpoint_that_does_not_load_is_fatal_and_names_why(loaded, reason):
    run = Run(state(0, CKPT))
    run(ev.Begin())
    run(ev.ResumeOrdered(1, 0, 12, 40))
    (fail,) = run(loaded)
    assert run.state.phase is Phase.FAILED and run.state.step == 0
    assert "cannot resume from the checkpoint of step 40 that quorum 12 offered" in fail.message
    assert reason in fail.message


def test_a_resume_order_that_does_not_fit_is_fatal_and_late_ones_are_ignored():
    run = Run(state(5, CKPT, attempt=3))
    run(ev.Begin())
    before = run.state
    assert run(ev.ResumeOrdered(3, 5, 12, 40)) == () and run.state is before  # an old attempt
    (fail,) = run(ev.ResumeOrdered(4, 5, 12, 4))
    assert "checkpoint of step 4, but it holds the state at step 5 already" in fail.message
    run = Run(state(5, CKPT))
    run(ev.Begin())
    (fail,) = run(ev.ResumeOrdered(1, 2, 12, 40))
    assert "ranks disagree on their step" in fail.message
    # Outside PLANNING an order can only be late: ignored, like every coordinator message.
    run = Run(state(5, CKPT))
    run.to_training(plan(5))
    training = run.state
    assert run(ev.ResumeOrdered(2, 5, 12, 40)) == () and run.state is training


def test_checkpoint_loaded_outside_resuming_is_a_bug():
    run = Run(state(0, CKPT))
    with pytest.raises(ProtocolError, match="CheckpointLoaded is not allowed while the step is IDLE"):
        run(ev.CheckpointLoaded(41, DataLedger()))
    assert run.state.phase is Phase.IDLE and run.state.step == 0


# ---------------------------------------------------------------- the coordinator


def test_an_offered_checkpoint_becomes_one_resume_order_and_the_next_round_asks_for_its_step():
    core = Core(CORE)
    effects = planned(core, 0, 40)
    plans = frames(effects, "plan")
    assert len(plans) == 3 and {p.quorum.resume_checkpoint_step for p in plans} == {40}
    assert all(p.quorum.HasField("resume_checkpoint_step") for p in plans)
    assert not [e for e in effects if isinstance(e, (co.ReportStep, co.ReportFailure))]
    assert core.c.stage is co.Stage.READY and core.c.last_committed == 40
    assert core.begin_all(0) == []  # a begin of the old step is late now
    (request,) = core.begin_all(41)
    assert isinstance(request, co.RequestQuorum) and request.step == 41


@pytest.mark.parametrize("settings, step, offered", [
    (dataclasses.replace(CORE, checkpoint_dir="", checkpoint_every_steps=0), 0, 40),  # no checkpoints here
    (CORE, 41, 40),                                                                     # not newer than the ranks
])
def test_an_offer_the_replica_cannot_take_is_removed_and_the_ranks_train(settings, step, offered):
    core = Core(settings)
    effects = planned(core, step, offered)
    plans = frames(effects, "plan")
    assert plans and not any(p.quorum.HasField("resume_checkpoint_step") for p in plans)
    assert core.c.stage is co.Stage.VOTING
    for rank in range(3):
        effects = vote(core, rank)
    (report,) = [e for e in effects if isinstance(e, co.ReportStep)]
    assert report.step == step


def test_step_reports_carry_the_newest_checkpoint_rank_0_saved():
    core = Core(CORE)
    planned(core, 5, None)
    for rank in range(3):
        effects = vote(core, rank)
    (report,) = [e for e in effects if isinstance(e, co.ReportStep)]
    assert report.checkpoint_step is None  # none saved yet
    assert core.feed(co.CheckpointSaved(5)) == [] and core.feed(co.CheckpointSaved(3)) == []
    planned(core, 6, None)
    for rank in range(3):
        effects = vote(core, rank, attempt=2)
    (report,) = [e for e in effects if isinstance(e, co.ReportStep)]
    assert (report.step, report.checkpoint_step) == (6, 5)  # the newest, never one past the step

