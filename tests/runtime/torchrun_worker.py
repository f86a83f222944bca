"""A training script as a torchrun user writes it: settings only from the environment.

    FTHSDP_CONTROLLER=host:port torchrun --nproc-per-node 2 tests/runtime/torchrun_worker.py OUT STEPS

RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT come from torchrun; the
coordinator address is derived from them. Writes OUT/rank-<RANK>.json at the end. A rank that
starts (or torchrun restarts) after the job COMPLETED exits 3, a configuration error exits 78
(`fthsdp.exit_status`), as the docs tell torchrun users to write it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fthsdp import ConfigurationError, FaultTolerantOptimizer, JobAlreadyCompleted, Manager, RuntimeSettings, exit_status
from fthsdp import state_digest


def main(out: Path, steps: int) -> int:
    settings = RuntimeSettings.from_env(max_steps=steps, quorum_timeout_s=30.0, gather_timeout_s=15.0,
                                        allreduce_timeout_s=10.0)
    dist.init_process_group("gloo", init_method="env://")  # the replica's own ranks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    manager = Manager(model, opt, settings, process_group=dist.group.WORLD)
    manager.start()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    rows = slice(settings.rank, None, settings.world_size)
    committed = []
    for x in manager.batches(lambda replica, position: torch.randn(8, 8, generator=torch.Generator().manual_seed(position))):
        ft_opt.zero_grad()
        loss = model(x[rows]).pow(2).mean()
        loss.backward()
        if ft_opt.step(loss):
            committed.append(manager.last_outcome.step)
    manager.close()
    (out / f"rank-{settings.rank}.json").write_text(json.dumps({
        "rank": settings.rank, "world_size": settings.world_size, "local_rank": settings.local_rank,
        "coordinator": settings.coordinator_address, "committed": committed, "step": manager.step,
        "digest": state_digest(model, opt, manager.ledger.to_json(), manager.step)}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
    except (JobAlreadyCompleted, ConfigurationError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(exit_status(exc))
