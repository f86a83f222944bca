"""fthsdp.data under one in-process Manager against a real controller (CLI subprocess): a retried
step trains the same samples, the controller's LR scale leaves the scheduler's LR alone,
`manager.digest()` is the state digest; and register_state says what it accepts."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, Seams, state_digest
from fthsdp.data import ReplicaShard, ShuffledLoader
from tests.runtime.cluster import start_controller
from tests.runtime.faults import FailingSync
from tests.runtime.test_data import Numbers, reference
from tests.trainer_secret import SECRET


def _manager(controller_grpc: str = "127.0.0.1:1", seams: Seams = Seams(), pre_init=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = RuntimeSettings(job_id="t", replica_id="r1", controller_address=controller_grpc, quorum_timeout_s=20.0,
                               heartbeat_interval_s=0.5, job_secret=SECRET)
    return Manager(model, opt, settings, seams=seams, pre_init=pre_init), model, opt


@pytest.mark.parametrize("make, named", [
    (lambda: RandomSampler(range(8)), "RandomSampler"),
    (lambda: DataLoader(range(8), shuffle=True), "DataLoader"),
    (lambda: pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader(range(8)), "StatefulDataLoader"),
])
def test_register_state_refuses_data_positions_and_says_what_it_accepts(make, named):
    manager, _, _ = _manager()
    with pytest.raises(TypeError, match=rf"state 'data' \({named}\) is a data position.*register_state accepts "
                                        rf"objects with state_dict\(\) and load_state_dict\(\).*ShuffledLoader"):
        manager.register_state("data", make())
    with pytest.raises(TypeError, match=r"state 'thing' \(object\) has no state_dict\(\) method\. register_state "
                                        r"accepts .*an LR scheduler"):
        manager.register_state("thing", object())
    assert manager.registry.names == frozenset()  # nothing registered by the refusals
    manager.register_state("sched", torch.optim.lr_scheduler.StepLR(manager.optimizer, step_size=1))


def test_a_retried_step_trains_the_same_samples_and_the_lr_scale_leaves_the_scheduler_alone(tmp_path):
    ctl = start_controller(tmp_path / "controller.log", replicas=2, join_timeout_s=0.2, heartbeat_timeout_s=3.0,
                           lr_policy="linear")  # one healthy replica of two: lr_scale 0.5
    failed: list[int] = []

    def fail_step_1_once(plan):
        if plan is not None and plan.step == 1 and not failed:
            failed.append(plan.step)
            return "injected"
        return None

    loader = ShuffledLoader(Numbers(24), 3, ReplicaShard.of("r1", 2), seed=4, num_workers=2)
    manager, model, opt = _manager(ctl.grpc, Seams(sync=lambda s: FailingSync(s, fail_step_1_once)), loader.start)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    manager.register_state("sched", sched)
    manager.start()
    seen, updates = [], []
    try:
        ft_opt = FaultTolerantOptimizer(manager, opt)
        for _, batch in zip(range(5), manager.batches(loader.batch_at)):
            ft_opt.zero_grad()
            model(batch["x"]).sum().backward()
            weight, grad, lr = model.weight.detach().clone(), model.weight.grad.clone(), opt.param_groups[0]["lr"]
            committed = ft_opt.step()
            if committed:
                updates.append((lr, (weight - model.weight.detach()) / grad))
                sched.step()
            seen.append((manager.last_outcome.step, committed, batch["index"].tolist()))
            assert manager.digest() == state_digest(model, opt, manager.ledger.to_json(), manager.step,
                                                    manager.registry.state_dicts())
    finally:
        manager.close()
        loader.close()
        ctl.stop()
    assert [(s, c) for s, c, _ in seen] == [(0, True), (1, False), (1, True), (2, True), (3, True)]
    assert seen[1][2] == seen[2][2] == reference(24, 3, 1, 2, 4, 1)  # the retry: the same batch again
    assert [s for _, _, s in seen[2:]] == [reference(24, 3, 1, 2, 4, p) for p in (1, 2, 3)]
    # The optimizer stepped with the scheduler's lr x 0.5; the scheduler's lr itself is untouched.
    for lr, ratio in updates:
        assert torch.allclose(ratio, torch.full_like(ratio, lr * 0.5))
    assert [lr for lr, _ in updates] == pytest.approx([0.1, 0.05, 0.025, 0.0125])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4) == sched.get_last_lr()[0]
