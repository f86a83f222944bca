"""Durable checkpoints: atomic writes, checksums, resuming from the latest complete one."""

from __future__ import annotations

import os

import pytest
import torch

from fthsdp.checkpoint_store import CheckpointError, CheckpointStore, SimulatedCrash
from fthsdp.state_stream import state_digest


def _model_opt(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def test_save_then_load_round_trips(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    store.save_state(4, '{"positions": {"0": 4}}', model, opt)
    store.save_ledger_entry(4, "0", 4)
    assert store.latest_complete() == 4
    restored = store.load(4)
    other, other_opt = _model_opt(1)
    other.load_state_dict(restored.model_state)
    other_opt.load_state_dict(restored.optimizer_state)
    assert (restored.step, restored.ledger_json) == (4, '{"positions": {"0": 4}}')
    assert state_digest(other, other_opt) == state_digest(model, opt)
    assert store.ledger_entries(4) == {"0": 4}


@pytest.mark.parametrize("crash_at", ["before_rename", "before_checksum"])
def test_crash_during_write_leaves_previous_checkpoint_loadable(tmp_path, crash_at):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    store.save_state(2, "{}", model, opt)
    store.crash_at = crash_at
    with pytest.raises(SimulatedCrash):
        store.save_state(4, "{}", model, opt)
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


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_gives_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    model, opt = _model_opt(0)
    with pytest.raises(CheckpointError, match="cannot write checkpoint of step 3"):
        CheckpointStore(ro).save_state(3, "{}", model, opt)


def test_directory_blocked_by_a_file_gives_clear_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    model, opt = _model_opt(0)
    with pytest.raises(CheckpointError, match="cannot write checkpoint of step 3"):
        CheckpointStore(blocker).save_state(3, "{}", model, opt)
