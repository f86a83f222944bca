"""A training script whose work goes on after `Manager.close()`, as a user's export does.

    python -m tests.runtime.closing_worker OUT STEPS

Trains STEPS steps (settings from the agent's environment), closes the manager (its replica
FINISHED), prints "closed" to stderr, then waits until OUT/go exists (the test creates it: the
work after close takes as long as the test wants, no sleep) and writes OUT/saved-<pid>.json:
the user's post-training output. Exits 0 by itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
from tests.waiting import wait_until


def main(out: Path, steps: int) -> int:
    settings = RuntimeSettings.from_env(max_steps=steps, quorum_timeout_s=30.0)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = Manager(model, opt, settings).start()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    for x in manager.batches(lambda replica, position: torch.full((2, 4), float(position))):
        ft_opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        ft_opt.step(loss)
    manager.close()
    print("closed", file=sys.stderr, flush=True)
    wait_until((out / "go").exists, 300.0, "the test's go")  # the user's work after close
    (out / f"saved-{os.getpid()}.json").write_text(json.dumps({"step": manager.step}))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
