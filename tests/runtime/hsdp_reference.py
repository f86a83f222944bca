"""PyTorch's own HSDP, no fault tolerance: the reference the FSDP2 runs under fthsdp must match.

Run as `python -m tests.runtime.hsdp_reference CONFIG_JSON`, one process per (replica, rank):
the same model, optimizer, data and seed as tests/runtime/train_worker.py, wrapped with
fully_shard on a 2-D mesh (replicate x shard) over Gloo. After `steps` steps each process
saves its local tensors to <out>/<replica>-<rank>.pt.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests.runtime.train_worker import batch_at, build_model, local_state, shard_model


def main(cfg: dict) -> int:
    replicas, ranks = cfg["replicas"], cfg["ranks"]
    global_rank = cfg["global_rank"]
    replica, rank = divmod(global_rank, ranks)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=global_rank,
                            world_size=replicas * ranks, timeout=timedelta(seconds=30))
    model = build_model()
    shard_model(model, init_device_mesh("cpu", (replicas, ranks), mesh_dim_names=("replicate", "shard")))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for position in range(cfg["steps"]):
        x, y = batch_at(str(replica), position)
        rows = slice(rank, None, ranks)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    torch.save(local_state(model, opt), f"{cfg['out']}/{replica}-{rank}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
