"""Data throughput through fthsdp.data against a plain DataLoader, and the resume time.

    python -m bench.data [--json] [--workers 4] [--batch-size 64] [--batches 200] [--rounds 5]

One map-style Dataset whose items cost CPU to make (a seeded tensor per sample and a little
arithmetic, as a decode would), read two ways with the same number of worker processes:
- `samples_per_s_fthsdp`: `fthsdp.data.ShuffledLoader(...).batch_at(replica, p)` for
  p = 0, 1, 2, ... (what `Manager.batches` asks for), persistent workers, default prefetch;
- `samples_per_s_plain`: `torch.utils.data.DataLoader(shuffle=True, persistent_workers=True)`,
  the same batch size, workers and prefetch.
Both loaders are built and warmed first; then `--rounds` rounds of `--batches` batches of each,
taken in turns of 20 batches (who goes first alternates), so both see the same machine. The numbers are medians
over rounds; `ratio` = fthsdp / plain (the goal is >= 0.95: the position protocol costs the
DataLoader nothing). `resume_s` is what a restarted replica pays to get its first batch at
its ledger position (`--resume-at`): a new ShuffledLoader, its workers forked, the batch
served (median over rounds); `seek_s` the cost of a position jump in a running loader (a
retried step, a catch-up): the prefetched batches dropped, the asked one served (its prefetch
is refilled, untimed, before the next round: the rates are steady-state ones).

One JSON line (FIELDS): samples_per_s_fthsdp, samples_per_s_plain, ratio, resume_s, seek_s,
and the settings (workers, batch_size, batches, rounds, resume_at).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from fthsdp.data import ReplicaShard, ShuffledLoader

#: batches read from one loader before the other has its turn
CHUNK_BATCHES = 20
#: the fields of the JSON line (`python -m bench.data --json`) and their types
FIELDS = {"bench": str, "samples_per_s_fthsdp": float, "samples_per_s_plain": float, "ratio": float,
          "resume_s": float, "seek_s": float, "workers": int, "batch_size": int, "batches": int, "rounds": int,
          "resume_at": int}


class Synthetic(Dataset):
    """Sample i: `features` values from a generator seeded with i, through a little arithmetic."""

    def __init__(self, samples: int, features: int) -> None:
        self.samples, self.features = samples, features

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = torch.randn(self.features, generator=torch.Generator().manual_seed(i))
        return torch.tanh(x * 1.5).cumsum(0) / self.features, i % 10


def _rate(next_batch, batches: int, batch_size: int) -> float:
    t0 = time.perf_counter()
    for _ in range(batches):
        next_batch()
    return batches * batch_size / (time.perf_counter() - t0)


def measure(workers: int, batch_size: int, batches: int, rounds: int, samples: int, features: int,
            resume_at: int) -> dict:
    dataset = Synthetic(samples, features)
    shard = ReplicaShard("0", 0, 1)
    ours = ShuffledLoader(dataset, batch_size, shard, seed=0, num_workers=workers)
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                       persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))
    per_epoch = ours.batches_per_epoch
    state = {"position": 0, "plain": iter(plain)}

    def next_ours() -> None:
        ours.batch_at("0", state["position"])
        state["position"] += 1

    def next_plain() -> None:
        try:
            next(state["plain"])
        except StopIteration:  # an epoch ended: the next one (the fthsdp stream runs across epochs)
            state["plain"] = iter(plain)
            next(state["plain"])

    ours.start()
    _rate(next_ours, min(batches, per_epoch), batch_size)  # warm: workers up, caches filled
    _rate(next_plain, min(batches, per_epoch), batch_size)
    rates: dict[str, list[float]] = {"fthsdp": [], "plain": []}
    seeks, resumes = [], []
    for r in range(rounds):
        pair = [("fthsdp", next_ours), ("plain", next_plain)]
        spent = {"fthsdp": 0.0, "plain": 0.0}
        chunk = min(CHUNK_BATCHES, batches)
        chunks = batches // chunk
        for c in range(chunks):  # alternate in chunks, so that both see the same moments of the machine
            for name, fn in pair if (r + c) % 2 == 0 else pair[::-1]:
                spent[name] += chunk * batch_size / _rate(fn, chunk, batch_size)
        for name in rates:
            rates[name].append(chunks * chunk * batch_size / spent[name])
        t0 = time.perf_counter()
        ours.batch_at("0", state["position"] + 3)  # a jump: three prefetched batches dropped
        seeks.append(time.perf_counter() - t0)
        state["position"] += 4
        _rate(next_ours, 2 * max(workers, 1), batch_size)  # refill its prefetch before the next timed round
        t0 = time.perf_counter()
        with ShuffledLoader(dataset, batch_size, shard, seed=0, num_workers=workers) as restarted:
            restarted.start()
            restarted.batch_at("0", resume_at)
            resumes.append(time.perf_counter() - t0)
    ours.close()
    del state["plain"]
    fthsdp, base = statistics.median(rates["fthsdp"]), statistics.median(rates["plain"])
    return {"bench": "data", "workers": workers, "batch_size": batch_size, "batches": batches, "rounds": rounds,
            "samples": samples, "features": features, "samples_per_s_fthsdp": round(fthsdp, 1),
            "samples_per_s_plain": round(base, 1), "ratio": round(fthsdp / base, 3),
            "resume_s": round(statistics.median(resumes), 4), "resume_at": resume_at,
            "seek_s": round(statistics.median(seeks), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.data", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON line on stdout")
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes (both loaders)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=200, help="batches per loader and round")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians are reported)")
    p.add_argument("--samples", type=int, default=50_000, help="dataset length")
    p.add_argument("--features", type=int, default=2048, help="values per sample")
    p.add_argument("--resume-at", type=int, default=10_000, help="the ledger position a restarted replica resumes at")
    args = p.parse_args(argv)
    if min(args.batch_size, args.batches, args.rounds, args.samples, args.features) < 1 or args.workers < 0 \
            or args.resume_at < 0 or args.samples < args.batch_size:
        p.error(f"sizes must be >= 1 (samples >= batch size), workers and --resume-at >= 0: got {vars(args)}")
    result = measure(args.workers, args.batch_size, args.batches, args.rounds, args.samples, args.features,
                     args.resume_at)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
