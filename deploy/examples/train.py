"""Example trainer: a small model trained under FT-HSDP, one process per (replica, rank).

Run by deploy/examples/train-job.yaml (one pod per replica) or by an agent. It is written
against the trainer runtime described in DESIGN.md §4 (`fthsdp.Manager` wraps the model, the
optimizer and the data position, and drives quorum, catch-up, all-reduce and commit). The
Manager's API was being written alongside this file: check `help(fthsdp.Manager)` and adjust
the two marked calls if they differ.
"""

from __future__ import annotations

import argparse
import os

import torch

import fthsdp


def batches(position: int, batch_size: int = 32):
    """A deterministic synthetic stream: batch i is the same wherever it is trained."""
    while True:
        g = torch.Generator().manual_seed(position)
        x = torch.randn(batch_size, 16, generator=g)
        yield position, x, x.sum(dim=1, keepdim=True)
        position += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--controller", default=os.environ.get("FTHSDP_CONTROLLER", "localhost:50051"))
    parser.add_argument("--replica-id", default=os.environ.get("FTHSDP_REPLICA_ID", "0"))
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # (1) Manager construction: joins the job through the controller (replica leader = rank 0).
    manager = fthsdp.Manager(controller=args.controller, replica_id=args.replica_id,
                             model=model, optimizer=optimizer)
    while manager.step < args.steps:
        # (2) One fault-tolerant step: quorum, catch-up if behind, forward/backward on the batch
        # at this replica's ledger position, FTAR, two-phase commit.
        manager.train_step(lambda pos: torch.nn.functional.mse_loss(*_forward(model, pos)))
    return 0


def _forward(model: torch.nn.Module, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    _, x, y = next(batches(position))
    return model(x), y


if __name__ == "__main__":
    raise SystemExit(main())
