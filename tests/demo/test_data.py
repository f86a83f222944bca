"""The demo's per-replica data streams (pure)."""

from __future__ import annotations

import pytest

from fthsdp.demo.data import batch_rows


def test_streams_are_deterministic_and_cover_each_epoch_once():
    rows, replicas, batch = 100, 3, 10
    seen = [i for p in range(4) for r in range(replicas) for i in batch_rows(r, p, replicas, batch, rows, seed=7)]
    assert sorted(seen[:100]) == list(range(100))  # the first 10 global batches are one epoch
    assert list(batch_rows(1, 2, replicas, batch, rows, seed=7)) == list(batch_rows(1, 2, replicas, batch, rows, seed=7))
    assert list(batch_rows(1, 2, replicas, batch, rows, seed=7)) != list(batch_rows(1, 2, replicas, batch, rows, seed=8))
    across = batch_rows(0, 3, replicas, batch, rows, seed=7)  # global batch 9 ends epoch 0 exactly
    assert len(across) == batch and len(set(across)) == batch


@pytest.mark.parametrize("args", [(3, 0, 3, 10, 100), (0, -1, 3, 10, 100), (0, 0, 3, 0, 100), (0, 0, 3, 10, 5)])
def test_bad_requests_raise(args):
    with pytest.raises(ValueError):
        batch_rows(*args, seed=0)
