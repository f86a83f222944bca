"""Streaming DiLoCo in the rank protocol, the fragment cut and the settings that choose it (no I/O).

H = 4 inner steps between two syncs of the same parameters, F = 2 fragments: a sync every
K = H / F = 2 inner steps, carrying fragment (step + 1) mod F."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from fthsdp.data_ledger import DataLedger
from fthsdp.settings import RuntimeSettings
from fthsdp.step import events as ev
from fthsdp.step.protocol import Phase
from fthsdp.sync.outer import OuterSync, fragments_of
from protos import sync_modes
from tests.runtime.protocol_helpers import SETTINGS, Run, plan, state

H, F = 4, 2
K = H // F
# blocking fragment syncs (no overlap): tests/runtime/test_protocol_overlap.py has the overlapped ones
STREAM = dataclasses.replace(SETTINGS, sync_mode="streaming_diloco", sync_every_steps=H, sync_fragments=F,
                             sync_overlap_steps=0).validate()


def sync(run: Run, commit: bool = True, **plan_fields) -> list:
    """K inner steps (when due), then one sync attempt (the coordinator's next): every effect on the way."""
    effects, attempt = [], run.state.attempt + 1
    while run.state.inner < K:
        effects += run(ev.Begin())
        effects += run(ev.End(0.5, 8))
    effects += run(ev.Begin())
    effects += run(ev.PlanArrived(attempt, run.state.step, plan(run.state.step, **plan_fields)))
    effects += run(ev.Reduced(True))
    effects += run(ev.DecisionArrived(attempt, commit, "all yes" if commit else "replica a voted no"))
    return effects


def of_type(effects, kind) -> list:
    return [e for e in effects if isinstance(e, kind)]


def test_a_sync_comes_every_h_over_f_inner_steps_and_carries_one_fragment_taken_reduced_and_applied():
    run = Run(state(3, STREAM))
    assert run(ev.Begin()) == (ev.BeginInner(3, 0),)
    assert run(ev.End(0.5, 8)) == (ev.InnerStep(3, 0),)
    run(ev.Begin())
    assert run(ev.End(0.5, 8)) == (ev.InnerStep(3, 1), ev.TakePseudoGradient(3, 0))  # fragment (3 + 1) mod 2
    assert run.state.inner == K
    p = plan(3)
    run(ev.Begin())
    assert run(ev.PlanArrived(1, 3, p))[-1] == ev.ReducePseudoGradient(p, 0)
    run(ev.Reduced(True))
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert of_type(effects, ev.ApplyOuterStep) == [ev.ApplyOuterStep(p, 0)]
    assert (run.state.phase, run.state.step, run.state.inner) == (Phase.IDLE, 4, 0)
    assert run.state.ledger == DataLedger({"a": 3 + K, "b": 3 + K})  # the K inner steps since the last sync
    assert of_type(sync(run), ev.TakePseudoGradient) == [ev.TakePseudoGradient(4, 1)]


@pytest.mark.parametrize("h, f", [(4, 2), (8, 4), (6, 3), (4, 1), (12, 4)])
def test_fragment_f_is_due_when_the_inner_steps_trained_are_f_times_h_over_f_mod_h(h, f):
    s = dataclasses.replace(SETTINGS, sync_mode="streaming_diloco", sync_every_steps=h, sync_fragments=f).validate()
    k = s.inner_steps_per_sync
    due = {}
    for step in range(3 * f):
        trained = (step + 1) * k  # inner steps trained once the sync of `step` commits
        fragment = s.fragment_at(step)
        assert trained % h == fragment * k % h
        due.setdefault(fragment, []).append(trained)
    assert sorted(due) == list(range(f))  # every fragment, each once per h inner steps
    assert all(b - a == h for trained in due.values() for a, b in zip(trained, trained[1:]))


def test_the_ledger_moves_exactly_once_per_inner_step_along_the_committed_history():
    run = Run(state(0, STREAM, ledger=DataLedger({"a": 0, "b": 0})))
    for _ in range(2 * F):
        sync(run)
    assert run.state.ledger == DataLedger({"a": 2 * H, "b": 2 * H}) and run.state.step == 2 * F


def test_a_retried_fragment_sync_keeps_its_fragment_and_pseudo_gradient_and_counts_only_contributors():
    run = Run(state(4, STREAM))
    effects = sync(run, commit=False)
    assert of_type(effects, ev.TakePseudoGradient) == [ev.TakePseudoGradient(4, 1)]
    assert (run.state.step, run.state.inner) == (4, K)  # no new inner steps before the retry
    effects = sync(run, quorum_id=10, included=("b",))
    assert not of_type(effects, ev.TakePseudoGradient) and not of_type(effects, ev.InnerStep)
    assert of_type(effects, ev.ReducePseudoGradient)[0].fragment == 1
    assert of_type(effects, ev.ApplyOuterStep)[0].fragment == 1
    assert run.state.ledger == DataLedger({"a": 4, "b": 4 + K})


def test_a_behind_replica_syncs_the_fragment_of_the_quorums_step_not_its_own():
    run = Run(state(0, STREAM))  # own fragment would be 1; the quorum is at step 5: fragment 0
    while run.state.inner < K:
        run(ev.Begin())
        run(ev.End(0.5, 8))
    run(ev.Begin())
    p = plan(5, behind=True)
    assert run(ev.PlanArrived(1, 0, p))[-1] == ev.ReducePseudoGradient(p, 0)
    run(ev.Reduced(True))
    run(ev.FetchFinished(True, "", DataLedger({"a": 10, "b": 9})))
    effects = run(ev.DecisionArrived(1, True, "all yes"))
    assert [type(e).__name__ for e in effects][:3] == ["StopServing", "AdoptFetched", "ApplyOuterStep"]
    assert of_type(effects, ev.ApplyOuterStep)[0].fragment == 0
    assert (run.state.step, run.state.inner) == (6, 0)
    assert run.state.ledger == DataLedger({"a": 10 + K, "b": 9})  # its own inner steps are not in the history


def test_a_rollback_restarts_the_schedule_at_the_checkpoints_step():
    run = Run(state(1, STREAM))
    while run.state.inner < K:
        run(ev.Begin())
        run(ev.End(0.5, 8))
    run(ev.Begin())
    run(ev.ResumeOrdered(1, 1, 9, 4))
    run(ev.CheckpointLoaded(5, DataLedger({"a": 10, "b": 10})))
    assert (run.state.step, run.state.inner) == (5, 0)
    assert of_type(sync(run), ev.TakePseudoGradient) == [ev.TakePseudoGradient(5, STREAM.fragment_at(5))]


# ---------------------------------------------------------------- the fragment cut


@pytest.mark.parametrize("sizes, count, runs", [
    ([10, 10, 10, 10], 2, [(0, 2), (2, 4)]),
    ([10, 10, 10, 10], 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ([100, 1, 1, 1, 100], 2, [(0, 3), (3, 5)]),
    ([1, 1, 1, 1000], 2, [(0, 3), (3, 4)]),
    ([1000, 1, 1, 1], 2, [(0, 1), (1, 4)]),
    ([5, 7], 1, [(0, 2)]),
])
def test_fragments_are_contiguous_runs_of_parameters_of_about_equal_size(sizes, count, runs):
    assert [(r.start, r.stop) for r in fragments_of(sizes, count)] == runs


def test_the_cut_covers_every_parameter_once_in_order_with_no_empty_fragment_on_random_models():
    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice([1, 4, 64, 4096]) for _ in range(rng.randint(1, 12))]
        count = rng.randint(1, len(sizes))
        runs = fragments_of(sizes, count)
        assert len(runs) == count and all(len(r) for r in runs)
        assert [i for r in runs for i in r] == list(range(len(sizes)))
        # about equal: no fragment boundary could move by one parameter to bring two neighbours closer
        totals = [sum(sizes[i] for i in r) for r in runs]
        assert max(totals) <= sum(sizes) / count + max(sizes)


@pytest.mark.parametrize("count", [0, 4])
def test_more_fragments_than_parameters_is_refused_by_name(count):
    with pytest.raises(ValueError, match=f"sync_fragments={count} needs between 1 and the model's 3 trainable"):
        fragments_of([1, 2, 3], count)


# ---------------------------------------------------------------- the settings and the agreement


def test_the_fragments_and_the_wire_dtype_come_from_the_environment():
    env = {"FTHSDP_SYNC_MODE": "streaming_diloco", "FTHSDP_SYNC_EVERY_STEPS": "8", "FTHSDP_SYNC_FRAGMENTS": "4",
           "FTHSDP_SYNC_WIRE_DTYPE": "bfloat16"}
    s = RuntimeSettings.from_env(env, controller_address="c:1", insecure_trainer_ports=True)
    assert (s.sync_mode, s.sync_every_steps, s.sync_fragments, s.sync_wire_dtype) == (
        "streaming_diloco", 8, 4, "bfloat16")
    assert (s.inner_steps_per_sync, s.fragment_at(0), s.fragment_at(3)) == (2, 1, 0)


def test_h_must_be_a_multiple_of_f():
    with pytest.raises(ValueError, match="sync_every_steps=6 must be a multiple of sync_fragments=4"):
        dataclasses.replace(STREAM, sync_every_steps=6, sync_fragments=4).validate()


@pytest.mark.parametrize("controller, trainer, refused", [
    (("streaming_diloco", 8, 4), ("streaming_diloco", 8, 4), False),
    (("streaming_diloco", 8, 4), ("streaming_diloco", 8, 2), True),
    (("diloco", 8, 0), ("diloco", 8, 1), False),  # a controller without the field means one fragment
    (("", 0, 0), ("streaming_diloco", 8, 4), False),  # a controller without a mode checks nothing
])
def test_the_controller_and_the_trainer_must_agree_on_the_fragments(controller, trainer, refused):
    (cm, ce, cf), (rm, re_, rf) = controller, trainer
    why = sync_modes.mismatch(cm, ce, rm, re_, cf, rf)
    assert bool(why) == refused
    if refused:
        assert "--sync-fragments 4" in why and "sync_fragments 2" in why and "FTHSDP_SYNC_FRAGMENTS" in why


# ---------------------------------------------------------------- the outer state: checkpoints, catch-up, the wire


def _outer(fragments: int) -> tuple[torch.nn.Module, OuterSync]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    s = dataclasses.replace(SETTINGS, sync_mode="streaming_diloco", sync_every_steps=4, sync_fragments=fragments)
    return model, OuterSync(list(model.parameters()), s.validate(), sharded=False)


def test_the_streaming_outer_state_holds_the_global_copy_and_each_fragments_optimizer_and_loads_back():
    model, outer = _outer(2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # inner steps moved the local model
    outer.take_pseudo_gradient(1)
    outer._work.copy_(outer._pseudo)  # as if reduced by one replica
    outer.apply(1.0, 1)
    state = outer.state_dict()
    assert state["fragments"] == 2 and len(state["global"]) == 4 and len(state["outer"]) == 2
    assert state["outer"][1]["state"] and not state["outer"][0]["state"]  # only fragment 1 has momentum
    _, other = _outer(2)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(other.global_tensors(), outer.global_tensors()))
    _, four = _outer(4)
    with pytest.raises(ValueError, match="holds 2 fragment\\(s\\) of 4 parameters, this rank syncs 4 of 4"):
        four.load_state_dict(state)


def test_bf16_on_the_wire_halves_the_bytes_of_every_fragment():
    _, outer = _outer(2)
    wide = outer.nbytes
    s = dataclasses.replace(outer.settings, sync_wire_dtype="bfloat16").validate()
    narrow = OuterSync(outer._params, s, sharded=False)
    assert narrow.wire_dtype is torch.bfloat16 and 2 * narrow.nbytes == wide == 4 * sum(
        p.numel() for p in outer._params)
    assert [2 * narrow.fragment_nbytes(f) for f in range(2)] == [outer.fragment_nbytes(f) for f in range(2)]
