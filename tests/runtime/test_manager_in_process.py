"""One replica's Manager in this process against a real controller (CLI subprocess)."""

from __future__ import annotations

import pytest
import torch

from fthsdp import FaultTolerantOptimizer, Manager, RetryLimitExceeded, RuntimeSettings
from tests.runtime.cluster import start_controller


@pytest.fixture
def controller(tmp_path):
    ctl = start_controller(tmp_path / "controller.log", replicas=2, join_timeout_s=0.2, heartbeat_timeout_s=3.0)
    yield ctl
    ctl.stop()


def _manager(controller, pre_init=None, fault_hook=None,
             **overrides) -> tuple[Manager, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = RuntimeSettings(job_id="t", replica_id="0", controller_address=controller.grpc,
                               quorum_timeout_s=20.0, heartbeat_interval_s=0.5, **overrides)
    return Manager(model, opt, settings, pre_init=pre_init, fault_hook=fault_hook), model, opt


def _train(manager: Manager, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[bool]:
    ft = FaultTolerantOptimizer(manager, opt)
    out = []
    for (x,) in zip(manager.batches(lambda r, p: torch.full((2, 4), float(p)))):
        if len(out) == steps:
            break
        ft.zero_grad()
        model(x).sum().backward()
        out.append(ft.step())
    return out


def test_unwritable_checkpoint_dir_logs_a_clear_error_and_training_goes_on(controller, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    events: list[str] = []
    manager, model, opt = _manager(controller, pre_init=lambda: events.append("pre_init"), lr_policy="linear",
                                   checkpoint_dir=str(blocker), checkpoint_every_steps=2)
    manager.start()
    try:
        assert _train(manager, model, opt, 4) == [True] * 4
        assert manager.step == 4 and manager.ledger.position("0") == 4
        assert "cannot write checkpoint of step 4" in manager.last_checkpoint_error
        assert manager.last_outcome.lr_scale == pytest.approx(0.5)  # 1 healthy of 2 configured, linear
        assert events == ["pre_init"]
    finally:
        manager.close()


def test_more_than_max_retries_failures_in_a_row_raise_a_clear_error(controller):
    manager, model, opt = _manager(controller, max_retries=2,
                                   fault_hook=lambda point, plan: "injected" if point == "before_vote" else None)
    manager.start()
    try:
        with pytest.raises(RetryLimitExceeded, match="failed 3 times in a row, more than max_retries=2"):
            _train(manager, model, opt, 10)
        assert manager.step == 0 and manager.ledger.position("0") == 0
    finally:
        manager.close()
