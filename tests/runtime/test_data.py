"""fthsdp.data and fthsdp.data_stream on their own: the order (pure), and real DataLoaders with worker
processes asked for the positions a ledger asks for (next, retried, jumped ahead, rolled back)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fthsdp.data import ReplicaShard, ShuffledLoader, ShuffledOrder
from fthsdp.data_stream import StreamBatches

#: the positions a replica's ledger can ask for, in order: next ones, a retry (same again), a jump
#: ahead (included while it aborted; a catch-up), a rollback (a checkpoint's position), a new epoch
ASKED = [0, 1, 2, 2, 3, 7, 8, 4, 5, 11, 12, 13, 0, 1]


class Numbers(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        worker = get_worker_info()
        return {"index": i, "worker": -1 if worker is None else worker.id, "x": torch.full((2,), float(i))}


class Stream(IterableDataset):
    """0, 1, 2, ... n-1 split among the workers, with its own state_dict (where each worker is)."""

    def __init__(self, n: int) -> None:
        self.n, self.next = n, None

    def __iter__(self):
        worker = get_worker_info()
        k, m = (worker.id, worker.num_workers) if worker else (0, 1)
        self.next = k if self.next is None else self.next
        while self.next < self.n:
            value, self.next = self.next, self.next + m
            yield value
        self.next = None

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = state["next"]


def reference(n: int, batch: int, index: int, count: int, seed: int, position: int) -> list[int]:
    per_epoch = (n // count) // batch
    epoch, b = divmod(position, per_epoch)
    part = np.random.default_rng([seed, epoch]).permutation(n)[index::count][:n // count]
    return part[b * batch:(b + 1) * batch].tolist()


# ---------------------------------------------------------------- the order (pure)

def test_each_epoch_gives_every_replica_its_own_part_once_in_a_new_order():
    n, batch, count = 103, 4, 3
    orders = [ShuffledOrder(n, batch, ReplicaShard(str(i), i, count), seed=5) for i in range(count)]
    per_epoch = orders[0].batches_per_epoch
    assert per_epoch == (103 // 3) // 4 == 8
    for epoch in range(3):
        parts = [[s for p in range(epoch * per_epoch, (epoch + 1) * per_epoch) for s in o.indices(p)] for o in orders]
        assert all(len(part) == len(set(part)) == per_epoch * batch for part in parts)  # none twice in an epoch
        assert not set(parts[0]) & set(parts[1]) and not set(parts[1]) & set(parts[2])  # replicas never overlap
    assert orders[0].indices(0) != orders[0].indices(per_epoch)  # epoch 1 is shuffled anew
    # random access: any position, in any order, is the documented batch
    for p in random.Random(1).sample(range(50), 20):
        assert orders[1].indices(p) == reference(n, batch, 1, count, 5, p)


def test_without_shuffle_or_drop_last():
    order = ShuffledOrder(10, 4, ReplicaShard("0", 0, 1), shuffle=False, drop_last=False)
    assert [order.indices(p) for p in range(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    assert order.epoch_of(3) == 1


@pytest.mark.parametrize("args, message", [
    ((10, 0, ReplicaShard("0", 0, 1)), "batch_size must be an integer >= 1, got 0"),
    ((10, 4, ReplicaShard("0", 0, 1), -1), "seed must be an integer >= 0, got -1"),
    ((10, 4, ReplicaShard("2", 2, 3)), "a dataset of 10 samples split among 3 replicas gives each 3, not one batch of 4"),
])
def test_an_order_that_cannot_be_is_refused_naming_the_value(args, message):
    with pytest.raises(ValueError, match=message):
        ShuffledOrder(*args)


def test_a_replica_index_comes_from_the_id_or_the_list_of_ids():
    assert ReplicaShard.of("r3", 4) == ReplicaShard("r3", 3, 4)
    assert ReplicaShard.of("replica-02", 4).index == 2 and ReplicaShard.of("0", 1).index == 0
    assert ReplicaShard.among("b", ["a", "b", "c"]) == ReplicaShard("b", 1, 3)
    with pytest.raises(ValueError, match="'trainer' does not end with a number"):
        ReplicaShard.of("trainer", 2)
    with pytest.raises(ValueError, match="replica 'r4' has index 4, outside 0..3 of the job's 4 replicas"):
        ReplicaShard.of("r4", 4)
    with pytest.raises(ValueError, match="'d' is not one of the job's replicas"):
        ReplicaShard.among("d", ["a", "b"])
    with pytest.raises(ValueError, match="name a replica twice"):
        ReplicaShard.among("a", ["a", "a"])
    with pytest.raises(ValueError, match="replica count must be an integer >= 1, got 0"):
        ReplicaShard("0", 0, 0)


# ---------------------------------------------------------------- a real DataLoader with workers

@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_serves_the_asked_position_whatever_was_prefetched(workers):
    shard = ReplicaShard.of("r1", 2)
    rng_before = torch.get_rng_state()
    with ShuffledLoader(Numbers(40), 3, shard, seed=9, num_workers=workers, prefetch_factor=4 if workers else None) \
            as loader:
        loader.start()
        got = [loader.batch_at("r1", p) for p in ASKED]
        assert [b["index"].tolist() for b in got] == [reference(40, 3, 1, 2, 9, p) for p in ASKED]
        assert {w for b in got for w in b["worker"].tolist()} == ({0, 1} if workers else {-1})
        # every position that was not the next one dropped what was prefetched and started there
        assert loader.seeks == sum(1 for a, b in zip(ASKED, ASKED[1:]) if b != a + 1)
        assert loader.epoch_of(12) == 2 and loader.batches_per_epoch == 6
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG streams belong to the runtime


def test_a_restarted_loader_starts_at_the_ledger_position():
    with ShuffledLoader(Numbers(40), 4, ReplicaShard("0", 0, 1), num_workers=2) as first:
        straight = [first.batch_at("0", p)["index"].tolist() for p in range(12)]
    with ShuffledLoader(Numbers(40), 4, ReplicaShard("0", 0, 1), num_workers=2) as restarted:
        assert [restarted.batch_at("0", p)["index"].tolist() for p in range(7, 12)] == straight[7:]


def test_the_stranger_is_refused_and_the_loader_is_unchanged():
    with pytest.raises(TypeError, match="map-style Dataset.*got a Stream.*StatefulDataLoader"):
        ShuffledLoader(Stream(10), 2, ReplicaShard("0", 0, 1))
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0, got -1"):
        ShuffledLoader(Numbers(10), 2, ReplicaShard("0", 0, 1), num_workers=-1)
    with ShuffledLoader(Numbers(12), 2, ReplicaShard("r0", 0, 1), num_workers=1) as loader:
        assert loader.batch_at("r0", 0)["index"].tolist() == reference(12, 2, 0, 1, 0, 0)
        with pytest.raises(ValueError, match="replica 'r0''s part of the data, not replica 'r1''s"):
            loader.batch_at("r1", 1)
        with pytest.raises(ValueError, match="a stream position must be an integer >= 0, got -1"):
            loader.batch_at("r0", -1)
        assert loader.seeks == 0
        assert loader.batch_at("r0", 1)["index"].tolist() == reference(12, 2, 0, 1, 0, 1)  # no seek: still next


# ---------------------------------------------------------------- torchdata's StatefulDataLoader

def _stateful(n: int = 50, workers: int = 2):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    return sdl.StatefulDataLoader(Stream(n), batch_size=4, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_is_served_at_the_asked_position(workers):
    straight = StreamBatches(_stateful(workers=workers), "0")
    expected = [straight.batch_at("0", p).tolist() for p in range(14)]
    if workers == 0:
        assert expected[13] == expected[0]  # 13 batches an epoch ([48, 49] the last): 13 starts the next one
    stream = StreamBatches(_stateful(workers=workers), "0", keep=2)
    assert [stream.batch_at("0", p).tolist() for p in ASKED] == [expected[p] for p in ASKED]
    assert stream.restored >= 3 and stream.skipped >= 4  # the retry, the rollbacks; the jumps read forward


def test_a_restarted_stream_resumes_from_its_saved_state(tmp_path):
    first = StreamBatches(_stateful(), "r0", state_dir=tmp_path, save_every=4)
    expected = [first.batch_at("r0", p).tolist() for p in range(11)]
    assert sorted(p.name for p in (tmp_path / "r0").iterdir()) == ["4.pt", "8.pt"]
    restarted = StreamBatches(_stateful(), "r0", state_dir=tmp_path, save_every=4)
    assert restarted.batch_at("r0", 9).tolist() == expected[9]
    assert (restarted.restored, restarted.skipped) == (1, 1)  # from position 8's state, one batch read forward
    without = StreamBatches(_stateful(), "r0")
    assert without.batch_at("r0", 9).tolist() == expected[9] and without.skipped == 9  # read again from the start
    (tmp_path / "r0" / "8.pt").write_bytes(b"not a state")
    damaged = StreamBatches(_stateful(), "r0", state_dir=tmp_path, save_every=4)
    with pytest.raises(ValueError, match=r"8\.pt does not load as a stream state"):
        damaged.batch_at("r0", 9)


def test_stream_batches_refuses_what_it_cannot_serve():
    with pytest.raises(TypeError, match="a list has no state_dict"):
        StreamBatches([1, 2], "0")
    with pytest.raises(ValueError, match="needs a state_dir"):
        StreamBatches(_stateful(workers=0), "0", save_every=3)
    stream = StreamBatches(_stateful(workers=0), "0")
    with pytest.raises(ValueError, match="this stream is replica '0''s, not replica '1''s"):
        stream.batch_at("1", 0)
