"""What the demo trains: the model, its optimizer, its batches and its held-out score, by name.

    w = workload(cfg, world_size)        # cfg["model"]: "mlp" (digits) or "gpt" (text)
    x, y = w.batch_at(replica_id, position)
    loss = w.loss(x[rows], y[rows]); w.evaluate() -> (held-out loss, accuracy)

"mlp": an MLP on scikit-learn's digits, replicated on every rank (SGD with momentum).
"gpt": the small decoder-only transformer of fthsdp/demo/gpt.py on Python's documentation
topics, sharded with FSDP2 over the replica's ranks when it has more than one (AdamW);
its accuracy is next-byte accuracy on held-out text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from fthsdp.demo.data import batch_rows



@dataclass
class Workload:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch_at: Callable[[str, int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[], tuple[float, float]]


def build_mlp(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def workload(cfg: dict, world_size: int) -> Workload:
    """Build the named workload; for "gpt" with world_size > 1 the default process group must
    be the replica's (FSDP2 shards over it)."""
    torch.manual_seed(cfg["seed"])
    index = {r: i for i, r in enumerate(cfg["replicas"])}
    if cfg.get("model", "mlp") == "gpt":
        return _gpt(cfg, world_size, index)
    data = np.load(cfg["data"])
    x_train, y_train = torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"])
    x_test, y_test = torch.from_numpy(data["x_test"]), torch.from_numpy(data["y_test"])
    model = build_mlp(cfg["hidden"])

    def batch_at(replica_id: str, position: int):
        rows = torch.from_numpy(batch_rows(index[replica_id], position, len(index), cfg["batch_rows"],
                                           len(x_train), cfg["seed"]))
        return x_train[rows], y_train[rows]

    @torch.no_grad()
    def evaluate() -> tuple[float, float]:
        logits = model(x_test)
        return (torch.nn.functional.cross_entropy(logits, y_test).item(),
                (logits.argmax(dim=1) == y_test).float().mean().item())

    return Workload(model, torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9), batch_at,
                    lambda x, y: torch.nn.functional.cross_entropy(model(x), y), evaluate)


def _gpt(cfg: dict, world_size: int, index: dict[str, int]) -> Workload:
    from fthsdp.demo.gpt import Corpus, GptConfig, TinyGPT, evaluate, shard

    corpus = Corpus.load()
    model = TinyGPT(GptConfig(**cfg.get("gpt", {})))
    if world_size > 1:
        from torch.distributed.device_mesh import init_device_mesh

        shard(model, init_device_mesh("cpu", (world_size,)))
    seq = model.config.seq_len
    return Workload(
        model, torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01),
        lambda replica_id, position: corpus.batch(index[replica_id], position, cfg["batch_rows"], seq, cfg["seed"]),
        model.loss, lambda: evaluate(model, corpus))
