"""An LLM-shaped workload that needs no download: a small decoder-only transformer on English text.

    text = Corpus.load()                          # Python's own documentation topics, as bytes
    x, y = text.batch(stream, position, rows=8, seq_len=64, seed=0)   # stream: one per replica
    model = TinyGPT(GptConfig())
    shard(model, mesh)                            # FSDP2: one group per block, then the root

The corpus is `pydoc_data.topics` (the help() texts that ship with CPython, ~0.5 MB of English
prose and code), byte-level tokens (vocabulary 256). The last tenth is held out. Batches are
a pure function of (stream, position, seed), so a retried step reads the same bytes again. The model is GPT-2 shaped: token and position
embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a tied output head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
HELD_OUT_FRACTION = 0.1


@dataclass(frozen=True)
class GptConfig:
    """Sizes of the model (the defaults train in well under 100 ms a step on one CPU core)."""
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    seq_len: int = 64
    vocab: int = VOCAB

    def validate(self) -> "GptConfig":
        problems = []
        for name in ("layers", "d_model", "heads", "seq_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.d_model % max(self.heads, 1):
            problems.append(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads}).")
        if self.vocab != VOCAB:
            problems.append(f"vocab must be {VOCAB} (byte-level tokens), got {self.vocab}.")
        if problems:
            raise ValueError("Invalid GptConfig: " + " ".join(problems))
        return self


class Block(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.config = c.validate()
        self.tokens = nn.Embedding(c.vocab, c.d_model)
        self.positions = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.d_model)
        for name, p in self.named_parameters():  # GPT-2's initialisation, residual projections scaled
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (batch, time, vocab) for token ids (batch, time); the head is the token embedding."""
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tokens.weight.t()

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def shard(model: TinyGPT, mesh, **fully_shard_kwargs) -> TinyGPT:
    """FSDP2 over the replica's ranks: one parameter group per block, then the root (embeddings,
    final norm), so one block's gradient crosses replicas while the next block runs backward."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=mesh, **fully_shard_kwargs)
    return model


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray     # uint8 tokens
    held_out: np.ndarray

    @classmethod
    def load(cls) -> "Corpus":
        from pydoc_data.topics import topics

        data = np.frombuffer("\n\n".join(topics[k] for k in sorted(topics)).encode(), dtype=np.uint8)
        cut = int(len(data) * (1 - HELD_OUT_FRACTION))
        return cls(data[:cut].copy(), data[cut:].copy())

    def batch(self, stream: int, position: int, rows: int, seq_len: int,
              seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number `position` of data stream `stream` (one per replica): `rows` windows of
        seq_len + 1 bytes at offsets drawn from (seed, stream, position); inputs and next-byte
        targets."""
        if stream < 0 or position < 0 or rows < 1 or not 0 < seq_len < len(self.train):
            raise ValueError(f"bad batch request: stream {stream}, position {position}, {rows} rows of "
                             f"{seq_len} tokens")
        rng = np.random.default_rng([seed, stream, position])
        starts = rng.integers(0, len(self.train) - seq_len - 1, size=rows)
        windows = torch.from_numpy(np.stack([self.train[s:s + seq_len + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def held_out_batch(self, rows: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed, evenly spaced windows of the held-out text (the same on every rank)."""
        starts = np.linspace(0, len(self.held_out) - seq_len - 2, rows).astype(np.int64)
        windows = torch.from_numpy(np.stack([self.held_out[s:s + seq_len + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def evaluate(model: TinyGPT, corpus: Corpus, rows: int = 32) -> tuple[float, float]:
    """(held-out cross entropy, next-byte accuracy)."""
    x, y = corpus.held_out_batch(rows, model.config.seq_len)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    return loss, (logits.argmax(-1) == y).float().mean().item()


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
