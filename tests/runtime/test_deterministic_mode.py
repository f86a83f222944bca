"""Deterministic mode: two runs of the same script and seed end bitwise identical (dropout and
all), and their checkpoints compare equal rank by rank; the environment switch is checked."""

from __future__ import annotations

import pytest
import torch

from fthsdp import determinism
from fthsdp.checkpoint_compare import compare, read_store_checkpoint
from fthsdp.settings import RuntimeSettings
from fthsdp.state.digest import state_digest
from tests.runtime.cluster import start_controller
from tests.runtime.test_manager_in_process import _manager, _train


@pytest.fixture
def restore_torch_flags():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]


def _run(tmp_path, name: str, seed: int):
    """One run of the job (its own controller), 3 steps; the digest and the checkpoint folder."""
    controller = start_controller(tmp_path / f"controller-{name}.log", replicas=1, join_timeout_s=0.2,
                                  heartbeat_timeout_s=3.0, lr_policy="linear")
    try:
        manager, model, opt = _manager(controller, deterministic=True, deterministic_seed=seed,
                                       checkpoint_dir=str(tmp_path / name), checkpoint_every_steps=3)
        manager.start()
        try:
            assert determinism.is_on() and manager.registry.rng is not None
            assert _train(manager, model, opt, 3) == [True] * 3
            return state_digest(model, opt), tmp_path / name
        finally:
            manager.close()
    finally:
        controller.stop()


def test_two_deterministic_runs_are_bitwise_identical(tmp_path, restore_torch_flags):
    # the model has dropout: without the runtime's per-step RNG the two runs would differ
    (a, ckpt_a), (b, ckpt_b) = _run(tmp_path, "a", 7), _run(tmp_path, "b", 7)
    assert a == b
    result = compare(read_store_checkpoint(ckpt_a), read_store_checkpoint(ckpt_b))
    assert result.diffs == [] and result.ranks == [0]


def test_another_seed_differs(tmp_path, restore_torch_flags):
    assert _run(tmp_path, "a", 7)[0] != _run(tmp_path, "b", 8)[0]


@pytest.mark.parametrize("text, on", [("1", True), ("0", False)])
def test_the_environment_switch(text, on):
    env = {"FTHSDP_CONTROLLER": "x:1", "FTHSDP_INSECURE_TRAINER_PORTS": "1"}
    s = RuntimeSettings.from_env({"FTHSDP_DETERMINISTIC": text, **env})
    assert s.deterministic is on
    with pytest.raises(ValueError, match="FTHSDP_DETERMINISTIC='yes' must be 0 or 1"):
        RuntimeSettings.from_env({"FTHSDP_DETERMINISTIC": "yes", **env})
