"""Durable checkpoints: atomic writes, checksums, resuming from the latest complete one."""

from __future__ import annotations

import pytest
import torch

from fthsdp.errors import CheckpointError
from fthsdp.state.checkpoint import CheckpointStore
from fthsdp.state.digest import state_digest
from tests.runtime.faults import CrashingStore, SimulatedCrash


def _model_opt(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def test_save_then_load_round_trips_with_registered_state(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    user = {"sched": torch.optim.lr_scheduler.StepLR(opt, 3).state_dict(), "rng": {"seed": 12345}}
    store.save_state(4, '{"positions": {"0": 4}}', model, opt, user)
    store.save_ledger_entry(4, "0", 4)
    assert store.latest_complete() == 4
    restored = store.load(4)
    other, other_opt = _model_opt(1)
    other.load_state_dict(restored.model_state)
    other_opt.load_state_dict(restored.optimizer_state)
    assert (restored.step, restored.ledger_json, restored.user_states) == (4, '{"positions": {"0": 4}}', user)
    assert state_digest(other, other_opt) == state_digest(model, opt)
    assert store.ledger_entries(4) == {"0": 4}


def test_a_payload_whose_step_differs_from_its_folder_is_refused_naming_both(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    store.save_state(5, "{}", model, opt)
    forged = tmp_path / "forged"
    CheckpointStore(forged).save_state(10**12, "{}", model, opt)
    # the forged payload, with its checksum recomputed, moved into step 5's folder
    for name in ("model_optim.pt", "model_optim.pt.sha256"):
        (store.step_dir(5) / name).write_bytes((CheckpointStore(forged).step_dir(10**12) / name).read_bytes())
    assert store.latest_complete() == 5  # its checksum matches: only the step gives it away
    with pytest.raises(CheckpointError, match=r"step 1000000000000 in its payload, not of step 5"):
        store.load(5)


@pytest.mark.parametrize("crash_before", [1, 2])  # the state file's rename, its checksum's
def test_crash_during_write_leaves_previous_checkpoint_loadable(tmp_path, crash_before):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    store.save_state(2, "{}", model, opt)
    with pytest.raises(SimulatedCrash):
        CrashingStore(tmp_path, crash_before).save_state(4, "{}", model, opt)
    assert store.latest_complete() == 2
    assert store.load(2).step == 2
    with pytest.raises(CheckpointError, match="incomplete"):
        store.load(4)


def test_corrupted_file_is_not_complete(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    path = store.save_state(2, "{}", model, opt)
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\x00\x01\x02")
    assert store.latest_complete() is None


def test_unwritable_directory_gives_clear_error():
    model, opt = _model_opt(0)  # nobody, root included, creates folders in /proc
    with pytest.raises(CheckpointError, match="cannot write checkpoint of step 3 to /proc/fthsdp-ckpt"):
        CheckpointStore("/proc/fthsdp-ckpt").save_state(3, "{}", model, opt)


def test_directory_blocked_by_a_file_gives_clear_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    model, opt = _model_opt(0)
    with pytest.raises(CheckpointError, match="cannot write checkpoint of step 3"):
        CheckpointStore(blocker).save_state(3, "{}", model, opt)
