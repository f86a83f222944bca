"""One replica's Manager in this process against a real controller (CLI subprocess)."""

from __future__ import annotations

import pytest
import torch

from fthsdp import FaultTolerantOptimizer, Manager, RetryLimitExceeded, RuntimeSettings, Seams
from fthsdp.step.protocol import Phase
from tests.runtime.cluster import start_controller
from tests.runtime.faults import FailingSync
from tests.runtime.test_controller_client import dead_address
from tests.trainer_secret import SECRET


@pytest.fixture
def controller(tmp_path):
    ctl = start_controller(tmp_path / "controller.log", replicas=2, join_timeout_s=0.2, heartbeat_timeout_s=3.0,
                           lr_policy="linear")
    yield ctl
    ctl.stop()


def _manager(controller, pre_init=None, seams=Seams(), **overrides) -> tuple[Manager, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = RuntimeSettings(**{"job_id": "t", "replica_id": "0", "controller_address": controller.grpc,
                                  "quorum_timeout_s": 20.0, "heartbeat_interval_s": 0.5, "job_secret": SECRET,
                                  **overrides})
    return Manager(model, opt, settings, pre_init=pre_init, seams=seams), model, opt


def _train(manager: Manager, model, opt, steps: int | None = None) -> list[bool]:
    ft = FaultTolerantOptimizer(manager, opt)
    out = []
    limit = range(steps) if steps is not None else iter(int, 1)  # zip() asks the limit first: no extra begin
    for _, x in zip(limit, manager.batches(lambda r, p: torch.full((2, 4), float(p)))):
        ft.zero_grad()
        model(x).sum().backward()
        out.append(ft.step())
    return out


def test_unwritable_checkpoint_dir_logs_a_clear_error_and_training_goes_on(controller, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    events: list[str] = []
    manager, model, opt = _manager(controller, pre_init=lambda: events.append("pre_init"),
                                   checkpoint_dir=str(blocker), checkpoint_every_steps=2)
    manager.start()
    try:
        assert _train(manager, model, opt, 4) == [True] * 4
        assert manager.step == 4 and manager.ledger.position("0") == 4
        assert "cannot write checkpoint of step 4" in manager.last_checkpoint_error
        assert manager.last_outcome.lr_scale == pytest.approx(0.5)  # the controller's: 1 healthy of 2, linear
        assert events == ["pre_init"]
    finally:
        manager.close()


def test_max_steps_ends_the_loop_and_close_finishes_the_replica(controller):
    manager, model, opt = _manager(controller, max_steps=3)
    manager.start()
    assert _train(manager, model, opt) == [True] * 3  # batches() stopped by itself
    assert manager.finished and manager.step == 3
    manager.close()
    assert manager.phase is Phase.FINISHED


def test_registered_state_moves_only_on_commit_and_a_retry_draws_the_same_numbers(controller):
    failed = []

    def fail_step_1_once(plan):
        if plan is not None and plan.step == 1 and not failed:
            failed.append(plan.step)
            return "injected"
        return None

    manager, model, opt = _manager(controller, seams=Seams(sync=lambda s: FailingSync(s, fail_step_1_once)))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    manager.register_state("sched", sched)
    manager.register_rng(seed=7)
    manager.start()
    draws: list = []
    try:
        ft = FaultTolerantOptimizer(manager, opt)
        for _, x in zip(range(4), manager.batches(lambda r, p: torch.full((2, 4), float(p)))):
            ft.zero_grad()
            draws.append((manager.step, torch.rand(3).tolist()))
            model(x).sum().backward()
            if ft.step():
                sched.step()
    finally:
        manager.close()
    steps = [s for s, _ in draws]
    assert steps == [0, 1, 1, 2]  # step 1 was retried
    assert draws[1][1] == draws[2][1] and draws[0][1] != draws[1][1]  # the retry drew the same numbers
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)


def test_a_controller_that_stays_away_becomes_a_clear_fatal_error_not_a_raw_one(controller):
    manager, model, opt = _manager(controller, max_retries=1, quorum_timeout_s=1.0)
    manager.start()
    try:
        assert _train(manager, model, opt, 1) == [True]
        controller.stop()
        with pytest.raises(RetryLimitExceeded, match="step 1 failed 2 times in a row.*Quorum got no answer within 1s"):
            _train(manager, model, opt, 1)
        assert manager.step == 1
    finally:
        manager.close()


def test_a_dead_controller_address_first_in_the_list_is_passed_over(controller):
    manager, model, opt = _manager(controller, controller_address=f"{dead_address()},{controller.grpc}")
    manager.start()
    try:
        assert _train(manager, model, opt, 2) == [True, True]
    finally:
        manager.close()


def test_more_than_max_retries_failures_in_a_row_raise_a_clear_error(controller):
    manager, model, opt = _manager(controller, max_retries=2,
                                   seams=Seams(sync=lambda s: FailingSync(s, lambda plan: "injected")))
    manager.start()
    try:
        with pytest.raises(RetryLimitExceeded, match="failed 3 times in a row, more than max_retries=2"):
            _train(manager, model, opt, 10)
        assert manager.step == 0 and manager.ledger.position("0") == 0
    finally:
        manager.close()
