"""The demo's data: scikit-learn's digits, split once, read as per-replica streams.

`prepare` (run by the demo, which imports scikit-learn once) writes the split to an .npz;
trainers load it with numpy only. `batch_rows` is pure: replica `i` of `replicas` reads,
at stream position p, global batch g = p * replicas + i of a seeded epoch-by-epoch
shuffle. The same seed gives the same data order in the faulty run and the baseline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEST_FRACTION = 0.2


def prepare(path: Path, seed: int) -> Path:
    """Load the digits (shipped inside scikit-learn, no download), split, save as .npz."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y.astype(np.int64), test_size=TEST_FRACTION, random_state=seed, stratify=y)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def batch_rows(replica_index: int, position: int, replicas: int, batch_rows_: int, rows: int,
               seed: int) -> np.ndarray:
    """Row indices of one replica's batch at one stream position (deterministic)."""
    if not 0 <= replica_index < replicas or position < 0 or batch_rows_ < 1 or rows < batch_rows_:
        raise ValueError(f"bad batch request: replica {replica_index} of {replicas}, position "
                         f"{position}, {batch_rows_} rows of {rows}")
    start = (position * replicas + replica_index) * batch_rows_
    out = []
    while len(out) < batch_rows_:
        epoch, offset = divmod(start + len(out), rows)
        order = np.random.default_rng([seed, epoch]).permutation(rows)
        out.extend(order[offset:offset + batch_rows_ - len(out)].tolist())
    return np.asarray(out, dtype=np.int64)
