"""Durable DCP checkpoints: atomic commits, checksums, the payload's step, retention, safe loading."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from fthsdp.errors import CheckpointError
from fthsdp.state.checkpoint import MARKER, SIDE_FILE, CheckpointStore
from fthsdp.state.digest import state_digest
from tests.runtime.faults import CrashingStore, SimulatedCrash

LEDGER = '{"positions": {"0": 4}}'


def _model_opt(seed: int, steps: int = 1):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    return model, opt


def _rewrite_marker(folder) -> None:
    """What someone with write access to the store can do: fix the checksums after a change."""
    marker = json.loads((folder / MARKER).read_text())
    marker["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in marker["files"]}
    (folder / MARKER).write_text(json.dumps(marker))


def test_save_then_load_round_trips_model_optimizer_ledger_and_registered_state(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0, steps=2)
    user = {"sched": torch.optim.lr_scheduler.StepLR(opt, 3).state_dict(), "rng": {"seed": 12345}}
    store.save_state(4, LEDGER, model, opt, user)
    store.save_ledger_entry(4, "0", 4)
    assert store.latest_complete() == 4
    other, other_opt = _model_opt(1, steps=0)  # a fresh process: no optimizer state yet
    restored = CheckpointStore(tmp_path).load(4, other, other_opt)
    assert (restored.step, restored.ledger_json, restored.user_states) == (4, LEDGER, user)
    assert state_digest(other, other_opt) == state_digest(model, opt)
    assert store.ledger_entries(4) == {"0": 4}


def test_an_optimizer_without_state_tensors_round_trips(tmp_path):
    """Plain SGD keeps no per-parameter state: its state_dict's "state" is empty and must come back
    as such (torch reads an optimizer state_dict without "state" as a flattened one)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    CheckpointStore(tmp_path).save_state(1, LEDGER, model, opt, {})
    other, _ = _model_opt(1, steps=0)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    CheckpointStore(tmp_path).load(1, other, other_opt)
    assert state_digest(other, other_opt) == state_digest(model, opt)


def test_the_directory_is_a_standard_dcp_checkpoint(tmp_path):
    model, opt = _model_opt(0)
    path = CheckpointStore(tmp_path).save_state(2, LEDGER, model, opt)
    read = {"model": {"0.weight": torch.zeros(3, 4)}, "optimizer": {"state": {"2.bias": {"exp_avg": torch.zeros(2)}}}}
    dcp.load(read, checkpoint_id=str(path))  # plain DCP, fully qualified names
    assert torch.equal(read["model"]["0.weight"], model[0].weight.detach())
    assert torch.equal(read["optimizer"]["state"]["2.bias"]["exp_avg"], opt.state[model[2].bias]["exp_avg"])


@pytest.mark.parametrize("crash_before", [1, 2, 3])  # the side file's rename, the marker's, the folder's
def test_crash_during_write_leaves_previous_checkpoint_loadable(tmp_path, crash_before):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    store.save_state(2, "{}", model, opt)
    with pytest.raises(SimulatedCrash):
        CrashingStore(tmp_path, crash_before).save_state(4, "{}", model, opt)
    assert store.steps() == [2] and store.latest_complete() == 2
    assert store.load(2, *_model_opt(1, steps=0)).step == 2
    assert store.save_state(4, "{}", model, opt).name == "step-0000000004"  # the leftovers are cleared


def test_corrupted_file_is_not_complete(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    path = store.save_state(2, "{}", model, opt)
    data = next(p for p in path.iterdir() if p.suffix == ".distcp")
    with open(data, "r+b") as f:
        f.seek(10)
        f.write(b"\x00\x01\x02")
    assert store.latest_complete() is None
    with pytest.raises(CheckpointError, match="fails its checksum"):
        store.load(2, *_model_opt(1, steps=0))


def test_a_payload_whose_step_differs_from_its_folder_is_refused_naming_both(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    folder = store.save_state(5, "{}", model, opt)
    side = torch.load(folder / SIDE_FILE, weights_only=True)
    side["step"] = 10 ** 12
    torch.save(side, folder / SIDE_FILE)
    _rewrite_marker(folder)
    assert store.latest_complete() == 5  # the marker is consistent: the payload is what lies
    target = _model_opt(1, steps=0)
    before = state_digest(*target)
    with pytest.raises(CheckpointError, match=r"step 1000000000000 in its payload, not of step 5"):
        CheckpointStore(tmp_path).load(5, *target)
    assert state_digest(*target) == before  # nothing was loaded


def test_a_folder_renamed_to_another_step_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    model, opt = _model_opt(0)
    store.save_state(5, "{}", model, opt).rename(store.step_dir(9))
    assert store.latest_complete() is None
    with pytest.raises(CheckpointError, match="marked as the state of step 5, not of step 9"):
        store.load(9, *_model_opt(1, steps=0))


def test_with_a_key_only_signed_checkpoints_count(tmp_path):
    model, opt = _model_opt(0)
    signed = CheckpointStore(tmp_path, key=b"job-secret")
    folder = signed.save_state(5, "{}", model, opt)
    assert signed.latest_complete() == 5
    side = torch.load(folder / SIDE_FILE, weights_only=True)
    side["ledger"] = '{"positions": {"0": 999}}'  # changed, checksums fixed, but no key to sign with
    torch.save(side, folder / SIDE_FILE)
    _rewrite_marker(folder)
    assert CheckpointStore(tmp_path).latest_complete() == 5  # without the key only checksums are checked
    with pytest.raises(CheckpointError, match="not signed with this job's key"):
        CheckpointStore(tmp_path, key=b"job-secret").load(5, *_model_opt(1, steps=0))
    assert CheckpointStore(tmp_path, key=b"other-secret").latest_complete() is None


class _RunsCode:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_metadata_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore(tmp_path / "ckpt")
    model, opt = _model_opt(0)
    folder = store.save_state(3, "{}", model, opt)
    (folder / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    _rewrite_marker(folder)
    with pytest.raises(CheckpointError, match="builtins.exec"):
        store.load(3, *_model_opt(1, steps=0))
    assert not (tmp_path / "PWNED").exists()


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=2)
    model, opt = _model_opt(0)
    for step in (2, 4, 6, 8):
        store.save_state(step, "{}", model, opt)
        store.save_ledger_entry(step, "0", step)
    assert store.steps() == [6, 8]
    assert [store.ledger_entries(s) for s in (4, 6)] == [{}, {"0": 6}]


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
