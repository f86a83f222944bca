"""Semi-synchronous replicas: two Managers in this process (threads) against a real controller,
checked against sync training and against a DiLoCo outer step computed by hand."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest
import torch

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
from fthsdp.errors import Fatal
from fthsdp.sync.outer import OUTER_STATE_NAME
from tests.runtime.cluster import start_controller
from tests.trainer_secret import SECRET

LR = 0.1


@pytest.fixture
def controllers(tmp_path):
    """Start a controller of 2 replicas in a sync mode (its settings must be the trainers')."""
    started = []

    def start(mode: str = "sync", every: int = 1, join_timeout_s: float = 5.0, fragments: int = 1):
        log = tmp_path / f"controller-{len(started)}.log"
        started.append(start_controller(log, replicas=2, join_timeout_s=join_timeout_s, heartbeat_timeout_s=5.0,
                                        settings={"sync_mode": mode, "sync_every_steps": every,
                                                  "sync_fragments": fragments}))
        return started[-1]

    yield start
    for ctl in started:
        ctl.stop()


def batch_at(replica: str, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(int(replica) * 1_000 + position)
    x = torch.randn(4, 3, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def build() -> torch.nn.Module:
    """The same start on every replica (a generator of its own: the replicas' threads share torch's)."""
    model, g = torch.nn.Linear(3, 1), torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def train(controller, replica: str, steps: int, **overrides) -> dict:
    """One replica's loop, unchanged whatever the mode: `steps` protocol steps (syncs)."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    settings = RuntimeSettings(job_id="t", replica_id=replica, controller_address=controller.grpc, max_steps=steps,
                               quorum_timeout_s=20.0, heartbeat_interval_s=0.5, job_secret=SECRET, **overrides)
    manager = Manager(model, opt, settings).start()
    ft = FaultTolerantOptimizer(manager, opt)
    positions, digests = [], []
    batches = manager.batches(batch_at)
    try:
        for x, y in batches:
            positions.append(batches.last_position)
            ft.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            assert ft.step()
            if manager.outer is None or manager.ledger.position(replica) == positions[-1] + 1:
                digests.append((manager.step, manager.digest()))  # after a commit (a sync)
    finally:
        manager.close()
    outer = manager.registry.state_dicts().get(OUTER_STATE_NAME)
    return {"params": [p.detach().clone() for p in model.parameters()], "positions": positions,
            "digests": digests, "ledger": dict(manager.ledger.positions), "outer": outer,
            "begun_ahead": manager.syncs_begun_ahead}


def both(controller, steps: int, **overrides) -> tuple[dict, dict]:
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(train, controller, r, steps, **overrides) for r in ("0", "1")]
        return futures[0].result(timeout=120), futures[1].result(timeout=120)


def inner(params: list[torch.Tensor], replica: str, first: int, h: int,
          build: Callable[[], torch.nn.Module] = build) -> list[torch.Tensor]:
    """A naive reference: h plain SGD steps from `params` (of a `build()` model) on replica's
    batches first..first+h-1."""
    model = build()
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for pos in range(first, first + h):
        x, y = batch_at(replica, pos)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_local_sgd_with_one_inner_step_of_plain_sgd_is_sync_training(controllers):
    sync_a, sync_b = both(controllers(), 4)
    local_a, local_b = both(controllers("local_sgd", 1), 4, sync_mode="local_sgd", sync_every_steps=1)
    for a, b in zip(local_a["params"], local_b["params"]):
        assert torch.equal(a, b)  # bitwise equal replicas
    for s, l in zip(sync_a["params"], local_a["params"]):
        # G - mean(lr·g_r) against G - lr·mean(g_r): equal up to the rounding of where lr multiplies
        torch.testing.assert_close(l, s, rtol=1e-6, atol=1e-7)
    assert local_a["positions"] == sync_a["positions"] == [0, 1, 2, 3]
    assert local_a["ledger"] == sync_a["ledger"] == {"0": 4, "1": 4}


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_diloco_outer_nesterov_step_matches_a_reference_computed_by_hand(controllers, ahead):
    """With the quorum asked for at the due step (0, the default), one inner step ahead or
    right after the previous commit (2 = H): the same arithmetic."""
    h, lr, mu = 2, 0.7, 0.9
    a, b = both(controllers("diloco", h), 2, sync_mode="diloco", sync_every_steps=h, outer_lr=lr, outer_momentum=mu,
                sync_plan_ahead_steps=ahead)
    assert a["begun_ahead"] == b["begun_ahead"] == (0 if ahead == 0 else 2)  # both syncs' begins went ahead
    assert a["positions"] == [0, 1, 2, 3] and a["ledger"] == {"0": 4, "1": 4}
    assert [d for d in a["digests"]] == [d for d in b["digests"]] and [s for s, _ in a["digests"]] == [1, 2]
    for pa, pb in zip(a["params"], b["params"]):
        assert torch.equal(pa, pb)
    g = [p.detach().clone() for p in build().parameters()]
    momentum = None
    for outer_step in range(2):
        first = outer_step * h
        locals_ = [inner(g, r, first, h) for r in ("0", "1")]
        delta = [((gi - l0) + (gi - l1)) / 2 for gi, l0, l1 in zip(g, *locals_)]
        momentum = delta if momentum is None else [mu * m + d for m, d in zip(momentum, delta)]
        g = [gi - lr * (d + mu * m) for gi, d, m in zip(g, delta, momentum)]  # Nesterov
    for got, want in zip(a["params"], g):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    buffers = [s["momentum_buffer"] for s in a["outer"]["state"].values()]
    for got, want in zip(buffers, momentum):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode, every", [("diloco", 2), ("local_sgd", 3)])
def test_a_trainer_whose_sync_mode_is_not_the_controllers_refuses_to_train_naming_both(controllers, mode, every):
    ctl = controllers("diloco", 3, join_timeout_s=0.2)  # one trainer: its quorum closes on the timeout
    with pytest.raises(Fatal, match=rf"the controller runs the job with --sync-mode diloco --sync-every 3 --sync-fragments "
                                    rf"1, this trainer with sync_mode '{mode}' sync_every_steps {every} sync_fragments 1"):
        train(ctl, "0", 2, sync_mode=mode, sync_every_steps=every)


def test_a_sync_mode_that_is_not_known_is_refused_by_name():
    with pytest.raises(ValueError, match="sync_mode must be one of sync, local_sgd, diloco, streaming_diloco, got 'diloko'"):
        RuntimeSettings(sync_mode="diloko", insecure_trainer_ports=True).validate()
