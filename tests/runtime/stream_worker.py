"""One trainer process of the stream cluster test: an IterableDataset through torchdata's
StatefulDataLoader (two workers), read at the ledger's position by fthsdp.data_stream.StreamBatches,
which saves the loader's state every 3 positions under config["stream_dir"]; a restarted replica
resumes its stream from there. The test's part around it (records, the SIGKILL mid-epoch, pacing)
is tests/runtime/data_worker.py's.

Run as `python -m tests.runtime.stream_worker CONFIG_JSON`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
from fthsdp.data import ReplicaShard
from fthsdp.data_stream import StreamBatches
from tests.runtime import data_worker

BATCH, WORKERS, SAVE_EVERY = 4, 2, 3


class ReplicaStream(IterableDataset):
    """Replica `index` of `count`'s stream: every count-th sample from `index`, in a seeded order,
    one pass per epoch; worker k of m reads every m-th of them from k. Its state (where this worker
    is in the pass) is what StatefulDataLoader saves and restores."""

    def __init__(self, samples: int, index: int, count: int, seed: int = 0) -> None:
        part = torch.arange(index, samples, count)
        self.order = part[torch.randperm(len(part), generator=torch.Generator().manual_seed(seed + index))].tolist()
        self.items = data_worker.Samples(samples)
        self.next: int | None = None

    def __iter__(self):
        worker = get_worker_info()
        k, m = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        self.next = k if self.next is None else self.next
        while self.next < len(self.order):
            at, self.next = self.next, self.next + m
            yield self.items[self.order[at]]
        self.next = None

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = state["next"]


@dataclass(frozen=True)
class StreamSpec:
    samples: int
    state_dir: str


def stream_loader(spec: StreamSpec, shard: ReplicaShard) -> StatefulDataLoader:
    return StatefulDataLoader(ReplicaStream(spec.samples, shard.index, shard.count), batch_size=BATCH,
                              num_workers=WORKERS)


def train_stream(model: torch.nn.Module, spec: StreamSpec, settings: RuntimeSettings, replicas: int,
                 log_step: Callable[..., None]) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    shard = ReplicaShard.of(settings.replica_id, replicas)
    stream = StreamBatches(stream_loader(spec, shard), settings.replica_id, state_dir=spec.state_dir,
                           save_every=SAVE_EVERY)
    manager = Manager(model, opt, settings, pre_init=stream.start)
    manager.register_rng()
    manager.start()
    ft_opt = FaultTolerantOptimizer(manager, opt)
    for batch in manager.batches(stream.batch_at):
        ft_opt.zero_grad()
        torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]).backward()
        ft_opt.step()
        log_step(manager, batch, restored=stream.restored, skipped=stream.skipped)
    manager.close()


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    sys.exit(data_worker.main(config, train_stream, StreamSpec(config["samples"], config["stream_dir"])))
