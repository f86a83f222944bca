"""A replica's one-rank training script for the tests of a job's end, settings from the
environment as under torchrun or an agent.

    python -m tests.runtime.end_worker MAX_STEPS [DIE_AFTER]

Trains until the replica finishes (MAX_STEPS), then closes and exits 0. With DIE_AFTER it dies
(os._exit(9): no close, no goodbye) once it committed that many steps, as a killed rank does.
A runtime error ends it with `fthsdp.exit_status` (3: the job had COMPLETED before it trained
anything; 78: its configuration can never work), as examples/train_gpt.py does.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

from fthsdp import FaultTolerantOptimizer, Fatal, Manager, RuntimeSettings, exit_status


def main(max_steps: int, die_after: int | None) -> int:
    settings = RuntimeSettings.from_env(max_steps=max_steps, quorum_timeout_s=60.0, heartbeat_interval_s=0.5)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = Manager(model, opt, settings).start()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    committed = 0
    for x in manager.batches(lambda replica, position: torch.full((2, 4), float(position))):
        ft_opt.zero_grad()
        model(x).pow(2).mean().backward()
        committed += ft_opt.step()
        if die_after is not None and committed >= die_after:
            os._exit(9)
    manager.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    try:
        sys.exit(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None))
    except (Fatal, ValueError) as exc:
        logging.error("%s: %s", type(exc).__name__, exc)
        sys.exit(exit_status(exc))
