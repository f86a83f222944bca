"""examples/train_gpt.py is safe by default (issue 39, finding 8): without flags it checkpoints
beside the run, every CHECKPOINT_EVERY_STEPS steps (once, at the end, in a shorter run); the
environment's FTHSDP_CHECKPOINT_DIR and the flags say otherwise. (tests/runtime/test_example_gpt.py
runs it with these defaults and finds the checkpoint.)"""

from __future__ import annotations

import pytest

from examples.train_gpt import CHECKPOINT_EVERY_STEPS, CHECKPOINT_ROOT, checkpointing
from fthsdp.settings import ENV_CHECKPOINT_DIR, RuntimeSettings
from tests import trainer_secret


def _settings(**env: str) -> RuntimeSettings:
    return RuntimeSettings.from_env({"FTHSDP_JOB_ID": "llm", "FTHSDP_CONTROLLER": "127.0.0.1:1", **trainer_secret.ENV,
                                     **env})


@pytest.mark.parametrize("env, directory, every, steps, want", [
    ({}, None, None, 1000, (f"{CHECKPOINT_ROOT}/llm", CHECKPOINT_EVERY_STEPS)),
    ({}, None, None, 5, (f"{CHECKPOINT_ROOT}/llm", 5)),  # a short run: once, at its end
    ({ENV_CHECKPOINT_DIR: "/volume/ck"}, None, None, 1000, ("/volume/ck", CHECKPOINT_EVERY_STEPS)),
    ({ENV_CHECKPOINT_DIR: "/volume/ck"}, "/elsewhere", 7, 1000, ("/elsewhere", 7)),
    ({}, "", None, 1000, ("", 0)),   # --checkpoint-dir '': none
    ({}, None, 0, 1000, (f"{CHECKPOINT_ROOT}/llm", 0)),  # --checkpoint-every 0: none
])
def test_checkpoints_by_default_and_as_told(env, directory, every, steps, want):
    s = checkpointing(_settings(**env), directory, every, steps)
    assert (s.checkpoint_dir, s.checkpoint_every_steps) == want


def test_the_default_period_costs_at_most_one_percent():
    # measured with the example's default model, 2 ranks on CPU: 1.0 s a step without
    # checkpoints, 2.3 s a step with one after every step (the constant's comment)
    checkpoint_in_steps = 2.3 / 1.0 - 1.0
    assert checkpoint_in_steps / CHECKPOINT_EVERY_STEPS <= 0.01
