"""`fthsdp compare-checkpoints A B`: which ranks' shards differ between two checkpoints of the
same step, and where (tensor, index ranges, how many elements, the largest difference).

With deterministic training (the same data order and deterministic kernels), two runs (or two
replicas) reach bitwise-identical checkpoints at the same step; a rank whose shard differs
points at its host (silent data corruption). Comparison is bitwise: NaN payloads, signed zeros
and single flipped bits all count.

A checkpoint is read as *named tensors per rank* (`RankTensors`): {rank: {name: tensor}}. The
reader for today's format (`fthsdp.state.checkpoint`: one replicated model + optimizer +
registered-state file, written by one rank) yields rank 0 only; a reader for sharded (torch.distributed.checkpoint)
checkpoints plugs in by yielding every rank's shard under the same names.

Exit status: 0 identical, 1 they differ, 2 they could not be read or compared.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from fthsdp.errors import CheckpointError
from fthsdp.state import dcp_payload
from fthsdp.state.checkpoint import MARKER, STEP_DIR, CheckpointStore
from protos import cli_flags as flags

RankTensors = dict[int, dict[str, Any]]
#: Contiguous runs of differing elements reported per tensor (the count says how many in all).
MAX_RUNS = 8
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class TensorDiff:
    rank: int
    name: str
    #: "values" (same shape and dtype, some elements differ), "shape", "dtype", "missing_in_a",
    #: "missing_in_b", or "value" (a non-tensor entry such as a learning rate)
    what: str
    shape: tuple[int, ...] = ()
    dtype: str = ""
    count: int = 0
    elements: int = 0
    #: [first, last] flat indices of contiguous runs of differing elements (at most MAX_RUNS)
    runs: tuple[tuple[int, int], ...] = ()
    first_index: tuple[int, ...] = ()
    max_abs_diff: float = 0.0
    detail: str = ""


@dataclass
class Comparison:
    a: str
    b: str
    ranks: list[int] = field(default_factory=list)
    diffs: list[TensorDiff] = field(default_factory=list)

    @property
    def differing_ranks(self) -> list[int]:
        return sorted({d.rank for d in self.diffs})


def flatten(state: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts/lists of a state dict as flat names ("optimizer.state.0.exp_avg")."""
    out: dict[str, Any] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(state, (list, tuple)) and any(isinstance(v, (dict, list, tuple, torch.Tensor)) for v in state):
        for i, v in enumerate(state):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = state
    return out


def read_store_checkpoint(path: str | Path) -> RankTensors:
    """The store's DCP format: a step folder (or a checkpoint directory: its newest complete
    step), its files checked against the marker first. DCP joins each tensor's shards, so the
    whole state reads as one logical rank (0); a difference names the tensor and its indices."""
    path = Path(path)
    if (path / MARKER).exists():
        store, step = CheckpointStore(path.parent), _step_of(path)
    else:
        store = CheckpointStore(path)
        step = store.latest_complete()
        if step is None:
            raise CheckpointError(f"{path} holds no complete checkpoint (no step-*/{MARKER} matching its files)")
    if not store.is_complete(step):
        raise CheckpointError(f"checkpoint {store.step_dir(step)} is incomplete or fails its checksums")
    try:
        return {0: dcp_payload.read_whole(str(store.step_dir(step)))}
    except Exception as exc:  # noqa: BLE001 - any read failure: a bad checkpoint, named
        raise CheckpointError(f"checkpoint {store.step_dir(step)} does not read: {exc}") from None


def _step_of(folder: Path) -> int:
    m = STEP_DIR.match(folder.name)
    if m is None:
        raise CheckpointError(f"{folder} is not a step folder (step-NNNNNNNNNN)")
    return int(m.group(1))


def compare(a: RankTensors, b: RankTensors, a_name: str = "A", b_name: str = "B") -> Comparison:
    """Every difference between two checkpoints read as named tensors per rank."""
    out = Comparison(a_name, b_name, sorted(set(a) | set(b)))
    for rank in out.ranks:
        ta, tb = a.get(rank, {}), b.get(rank, {})
        for name in sorted(set(ta) | set(tb)):
            if name not in ta or name not in tb:
                out.diffs.append(TensorDiff(rank, name, "missing_in_a" if name not in ta else "missing_in_b"))
                continue
            diff = _compare_one(rank, name, ta[name], tb[name])
            if diff is not None:
                out.diffs.append(diff)
    return out


def _compare_one(rank: int, name: str, x: Any, y: Any) -> TensorDiff | None:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        if type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))):
            return None
        return TensorDiff(rank, name, "value", detail=f"{x!r} != {y!r}"[:200])
    if x.dtype != y.dtype:
        return TensorDiff(rank, name, "dtype", tuple(x.shape), str(x.dtype), detail=f"{x.dtype} != {y.dtype}")
    if x.shape != y.shape:
        return TensorDiff(rank, name, "shape", tuple(x.shape), str(x.dtype),
                          detail=f"{tuple(x.shape)} != {tuple(y.shape)}")
    bits = _INT_OF_SIZE.get(x.element_size())
    fx, fy = x.detach().cpu().contiguous().reshape(-1), y.detach().cpu().contiguous().reshape(-1)
    differ = (fx.view(bits) != fy.view(bits)) if bits is not None else (fx.view(torch.uint8) != fy.view(torch.uint8))
    if bits is None:  # an odd element size: compare bytes, report elements
        differ = differ.reshape(fx.numel(), -1).any(dim=1)
    count = int(differ.sum())
    if count == 0:
        return None
    where = differ.nonzero().reshape(-1)
    delta = _max_abs(fx[where], fy[where])
    first = int(where[0])
    return TensorDiff(rank, name, "values", tuple(x.shape), str(x.dtype), count, fx.numel(), _runs(where),
                      _unravel(first, tuple(x.shape)), delta)


def _max_abs(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.dtype == torch.bool:
        return 1.0
    d = (x.to(torch.complex128 if x.is_complex() else torch.float64) -
         y.to(torch.complex128 if y.is_complex() else torch.float64)).abs()
    return float("nan") if torch.isnan(d).any() else float(d.max())


def _runs(where: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """Contiguous runs of the sorted flat indices `where` (the first MAX_RUNS)."""
    idx = where.tolist()
    runs, start = [], idx[0]
    for prev, cur in zip(idx, idx[1:]):
        if cur != prev + 1:
            runs.append((start, prev))
            start = cur
            if len(runs) == MAX_RUNS:
                return tuple(runs)
    runs.append((start, idx[-1]))
    return tuple(runs[:MAX_RUNS])


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim)
        flat //= dim
    return tuple(reversed(out))


def describe(c: Comparison, hosts: Callable[[int], str | None] = lambda rank: None) -> str:
    if not c.diffs:
        return f"{c.a} and {c.b} are bitwise identical ({len(c.ranks)} rank(s))."
    lines = [f"{c.a} and {c.b} differ on {len(c.differing_ranks)} of {len(c.ranks)} rank(s): "
             + ", ".join(f"rank {r}" + (f" (host {hosts(r)})" if hosts(r) else "") for r in c.differing_ranks)]
    for d in c.diffs:
        if d.what == "values":
            runs = ", ".join(f"[{s}..{e}]" for s, e in d.runs) + (" …" if len(d.runs) == MAX_RUNS else "")
            lines.append(f"  rank {d.rank} {d.name} {d.dtype}{list(d.shape)}: {d.count} of {d.elements} elements "
                         f"differ at flat {runs}, first at {list(d.first_index)}; max |a-b| = {d.max_abs_diff:.6g}")
        else:
            lines.append(f"  rank {d.rank} {d.name}: {d.what.replace('_', ' ')}" + (f" ({d.detail})" if d.detail else ""))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    # the docstring's first paragraph (its first line alone stops mid-sentence), its exit status
    paragraphs = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="fthsdp compare-checkpoints", description=paragraphs[0],
                                epilog=paragraphs[-1], formatter_class=flags.DefaultsFormatter)
    flags.add_version(p)
    p.add_argument("a", type=flags.existing_path,
                   help="a checkpoint step folder (or a checkpoint directory: its newest complete step)")
    p.add_argument("b", type=flags.existing_path, help="the other checkpoint, of the same step")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.add_argument("--hosts", default="",
                   help="rank=host,... to name the hosts of differing ranks (default: none, ranks only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        hosts = dict(item.split("=", 1) for item in args.hosts.split(",") if item)
        ranks_hosts = {int(k): v for k, v in hosts.items()}
    except ValueError:
        print(f"fthsdp compare-checkpoints: --hosts must be rank=host,..., got {args.hosts!r}", file=sys.stderr)
        return 2
    try:
        result = compare(read_store_checkpoint(args.a), read_store_checkpoint(args.b), args.a, args.b)
    except (CheckpointError, OSError, RuntimeError) as exc:
        print(f"fthsdp compare-checkpoints: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"a": result.a, "b": result.b, "ranks": result.ranks, "differing_ranks": result.differing_ranks,
                          "hosts": {str(r): ranks_hosts.get(r) for r in result.differing_ranks},
                          "diffs": [asdict(d) for d in result.diffs]}))
    else:
        print(describe(result, ranks_hosts.get))
    return 1 if result.diffs else 0
