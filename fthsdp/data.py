"""Data the PyTorch way, read exactly once: a map-style Dataset through a real DataLoader,
at the position the data ledger holds for this replica.

    shard = ReplicaShard.of(settings.replica_id, replicas=4)   # "r2" of 4 -> index 2, count 4
    loader = ShuffledLoader(dataset, batch_size=32, shard=shard, seed=0, num_workers=4)
    manager = Manager(model, opt, settings, pre_init=loader.start)   # workers fork before the ports open
    for batch in manager.batches(loader.batch_at):                    # batch p of this replica's stream
        ...

The stream. Replica `index` of `count` reads, in epoch e, the samples `perm_e[index::count]`
(cut to the same length for every replica) in batches of `batch_size`, where `perm_e` is a
permutation of the whole dataset seeded by (seed, e) -- DistributedSampler's split, with the
epoch derived from the position: position p is batch p % batches_per_epoch of epoch
p // batches_per_epoch. So the batch at a position is a pure function of (seed, dataset
length, batch size, shard, position) (`ShuffledOrder`), known to any process without history:
a replica restarted on a spare, a replica that caught up, a job rolled back to a checkpoint
all read it at once. Keep those five fixed for the life of a job.

The ledger decides, the loader serves. `Manager.batches(loader.batch_at)` begins each step
(quorum, catch-up) and then asks for the batch at this replica's ledger position; the loader
keeps a `torch.utils.data.DataLoader` (worker processes, pinned memory, prefetch) running
ahead through the positions after the last one it served, so a step finds its batch ready
and the throughput is the DataLoader's. When the asked position is not the next one -- a
retried step (the ledger stayed), a replica whose aborted step others included (it moved on),
a catch-up, a restart, a rollback -- the loader seeks: the batches its workers prefetched
are dropped unread (they were never trained, and must not be: the ledger says where this
replica is), and the workers start again at the asked position (persistent workers are reused,
not re-forked). Nothing here moves the position: only a commit does, in the ledger.

Streams (an IterableDataset, torchdata's StatefulDataLoader) have no batch at a position
without reading the ones before it; `fthsdp.data_stream.StreamBatches` serves them at the
ledger's position by keeping the loader's own state_dict() per position (see there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

_TRAILING_INT = re.compile(r"(\d+)$")
#: the permutations ShuffledOrder keeps (the current epoch's and its neighbour's)
_CACHED_EPOCHS = 2


@dataclass(frozen=True)
class ReplicaShard:
    """Which part of the data one replica reads: its index among `count` replicas.

    Stable for the life of the job: a replica keeps its id across restarts, warm-spare swaps
    and catch-ups, so it keeps its index; `count` is the job's configured replica count (the
    controller's --replicas), not the number alive now -- a replica that is down leaves its
    part unread until it rejoins (its ledger position waits for it), and nobody else reads it.
    """

    replica_id: str
    index: int
    count: int

    def __post_init__(self) -> None:
        if type(self.count) is not int or self.count < 1:
            raise ValueError(f"a replica count must be an integer >= 1, got {self.count!r}")
        if type(self.index) is not int or not 0 <= self.index < self.count:
            raise ValueError(f"replica {self.replica_id!r} has index {self.index!r}, outside 0..{self.count - 1} "
                             f"of the job's {self.count} replicas")

    @classmethod
    def of(cls, replica_id: str, replicas: int) -> "ReplicaShard":
        """By the number the id ends with: "3", "r3" and "replica-03" are index 3 of `replicas`."""
        match = _TRAILING_INT.search(replica_id)
        if match is None:
            raise ValueError(f"replica id {replica_id!r} does not end with a number: name replicas 0..{replicas - 1} "
                             f"(or r0..r{replicas - 1}), or use ReplicaShard.among(replica_id, every_replica_id)")
        return cls(replica_id, int(match.group(1)), replicas)

    @classmethod
    def among(cls, replica_id: str, replica_ids: Sequence[str]) -> "ReplicaShard":
        """By the id's place in the job's list of replica ids (the same list, in the same order,
        on every replica)."""
        ids = list(replica_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"the replica ids {ids} name a replica twice")
        if replica_id not in ids:
            raise ValueError(f"replica {replica_id!r} is not one of the job's replicas {ids}")
        return cls(replica_id, ids.index(replica_id), len(ids))


class ShuffledOrder:
    """The pure part: the dataset indices of one replica's batch at a stream position
    (see the module docstring). Random access; no state but a cache of permutations."""

    def __init__(self, dataset_len: int, batch_size: int, shard: ReplicaShard, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True) -> None:
        if type(batch_size) is not int or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if type(seed) is not int or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.dataset_len, self.batch_size, self.shard, self.seed = dataset_len, batch_size, shard, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        #: samples each replica reads per epoch (every replica the same number)
        self.per_replica = dataset_len // shard.count
        whole, part = divmod(self.per_replica, batch_size)
        self.batches_per_epoch = whole + (1 if part and not drop_last else 0)
        if self.batches_per_epoch < 1:
            raise ValueError(f"a dataset of {dataset_len} samples split among {shard.count} replicas gives each "
                             f"{self.per_replica}, not one batch of {batch_size}"
                             + (" (drop_last=True)" if drop_last and self.per_replica else ""))
        self._perms: dict[int, np.ndarray] = {}

    def epoch_of(self, position: int) -> int:
        return self._check(position) // self.batches_per_epoch

    def indices(self, position: int) -> list[int]:
        """The dataset indices of the batch at `position` (0-based, across epochs)."""
        epoch, batch = divmod(self._check(position), self.batches_per_epoch)
        mine = self._replica_part(epoch)
        return mine[batch * self.batch_size:(batch + 1) * self.batch_size].tolist()

    def _replica_part(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            if self.shuffle:  # its own generator: the global RNG streams (registered or not) are not touched
                perm = np.random.default_rng([self.seed, epoch]).permutation(self.dataset_len)
            else:
                perm = np.arange(self.dataset_len)
            perm = perm[self.shard.index::self.shard.count][:self.per_replica]
            if len(self._perms) >= _CACHED_EPOCHS:
                self._perms.pop(max(self._perms, key=lambda e: abs(e - epoch)))  # the farthest epoch
            self._perms[epoch] = perm
        return perm

    @staticmethod
    def _check(position: int) -> int:
        if type(position) is not int or position < 0:
            raise ValueError(f"a stream position must be an integer >= 0, got {position!r}")
        return position


class PositionSampler(Sampler[list[int]]):
    """A batch sampler over positions `start, start + 1, ...` of a ShuffledOrder (endless:
    the run ends by its step count). `start` None: nothing (workers up, idle)."""

    def __init__(self, order: ShuffledOrder) -> None:
        self.order = order
        self.start: int | None = None

    def __iter__(self) -> Iterator[list[int]]:
        position = self.start
        while position is not None:
            yield self.order.indices(position)
            position += 1


class ShuffledLoader:
    """One replica's shuffled, epoch-aware stream of a map-style Dataset, served through a
    torch DataLoader at the positions the data ledger asks for (`batch_at`). The DataLoader
    arguments mean what they mean there; `persistent_workers` is always on with workers (a
    seek reuses them), `pin_memory` defaults to whether CUDA is there, and the DataLoader gets
    its own seeded generator (the global RNG streams are the runtime's). `start()` forks the
    workers (give it to the Manager as `pre_init`: before the trainer's ports and threads
    start); otherwise the first `batch_at` does."""

    def __init__(self, dataset: Dataset, batch_size: int, shard: ReplicaShard, *, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True, num_workers: int = 0,
                 collate_fn: Callable[[list[Any]], Any] | None = None, pin_memory: bool | None = None,
                 prefetch_factor: int | None = None, worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, timeout_s: float = 0.0) -> None:
        if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"ShuffledLoader reads a map-style Dataset (__getitem__ and __len__), got a "
                            f"{type(dataset).__name__}; for a stream use torchdata's StatefulDataLoader through "
                            f"fthsdp.data_stream.StreamBatches")
        if type(num_workers) is not int or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        self.dataset = dataset
        self.order = ShuffledOrder(len(dataset), batch_size, shard, seed, shuffle, drop_last)
        self.shard = shard
        self._sampler = PositionSampler(self.order)
        extra = {} if prefetch_factor is None else {"prefetch_factor": prefetch_factor}
        self.loader = DataLoader(
            dataset, batch_sampler=self._sampler, num_workers=num_workers, collate_fn=collate_fn,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            persistent_workers=num_workers > 0, timeout=timeout_s,
            generator=torch.Generator().manual_seed(seed), **extra)
        self._iter: Iterator[Any] | None = None
        self._next: int | None = None  # the position the running iterator yields next
        #: how many times a position jump dropped the prefetched batches and started again
        self.seeks = 0

    @property
    def batches_per_epoch(self) -> int:
        return self.order.batches_per_epoch

    def epoch_of(self, position: int) -> int:
        """The epoch the batch at `position` belongs to (for epoch-based schedules)."""
        return self.order.epoch_of(position)

    def start(self) -> None:
        """Fork the DataLoader's workers (idle until the first batch is asked for). Idempotent."""
        if self._iter is None:
            self._sampler.start = None
            self._iter = iter(self.loader)

    def batch_at(self, replica_id: str, position: int) -> Any:
        """The batch at `position` of this replica's stream (what `Manager.batches` calls)."""
        if replica_id != self.shard.replica_id:
            raise ValueError(f"this loader reads replica {self.shard.replica_id!r}'s part of the data, not replica "
                             f"{replica_id!r}'s: build its ReplicaShard from this trainer's settings.replica_id")
        self.order.epoch_of(position)  # a bad position is refused before the loader moves
        if self._iter is None or position != self._next:
            self.seek(position)
        assert self._iter is not None
        batch = next(self._iter)
        self._next = position + 1
        return batch

    def seek(self, position: int) -> None:
        """Serve `position` next: prefetched batches of other positions are dropped unread."""
        self.order.epoch_of(position)
        self.seeks += self._next is not None
        self._sampler.start = position
        self._iter = iter(self.loader)  # persistent workers: a reset (outstanding work is drained)
        self._next = position

    def close(self) -> None:
        """Stop the workers."""
        it, self._iter, self._next = self._iter, None, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.loader._iterator = None  # noqa: SLF001 - the persistent iterator the DataLoader keeps

    def __enter__(self) -> "ShuffledLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
