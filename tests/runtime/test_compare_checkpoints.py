"""`fthsdp compare-checkpoints`: real checkpoints written by CheckpointStore, one bit flipped,
the rank, tensor, index ranges and magnitude named; the per-rank abstraction for sharded formats."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fthsdp.checkpoint_compare import compare, describe, flatten, main, read_store_checkpoint
from fthsdp.state.checkpoint import CheckpointStore


def write(directory, corrupt=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    if corrupt:
        with torch.no_grad():
            corrupt(model)
    store = CheckpointStore(directory)
    store.save_state(7, "{}", model, opt)
    return store.step_dir(7)


def flip_bit(t: torch.Tensor, flat: int, bit: int = 30) -> None:
    t.view(-1).view(torch.int32)[flat] ^= 1 << bit


def test_identical_runs_are_bitwise_equal(tmp_path, capsys):
    a, b = write(tmp_path / "a"), write(tmp_path / "b")
    assert main([str(a), str(b)]) == 0
    assert "bitwise identical (1 rank(s))" in capsys.readouterr().out


def test_a_flipped_bit_and_a_spike_are_named_with_where_and_how_much(tmp_path, capsys):
    def corrupt(model):
        flip_bit(model[0].weight, 5)                 # one element, one bit
        model[2].weight.view(-1)[3:7] = 1e7          # four consecutive elements spiked
    a, b = write(tmp_path / "a"), write(tmp_path / "b", corrupt)
    assert main([str(a), str(b), "--json", "--hosts", "0=h7"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["differing_ranks"] == [0] and out["hosts"] == {"0": "h7"}
    by_name = {d["name"]: d for d in out["diffs"]}
    assert set(by_name) == {"model.0.weight", "model.2.weight"}
    w0 = by_name["model.0.weight"]
    assert (w0["what"], w0["count"], w0["elements"], w0["runs"], w0["first_index"]) == ("values", 1, 32, [[5, 5]], [1, 1])
    w2 = by_name["model.2.weight"]
    assert w2["count"] == 4 and w2["runs"] == [[3, 6]] and w2["max_abs_diff"] > 9e6
    assert main([str(a), str(b), "--hosts", "0=h7"]) == 1
    text = capsys.readouterr().out
    assert "differ on 1 of 1 rank(s): rank 0 (host h7)" in text
    assert "rank 0 model.2.weight torch.float32[2, 8]: 4 of 16 elements differ at flat [3..6]" in text


def test_a_checkpoint_directory_means_its_newest_complete_step(tmp_path):
    write(tmp_path / "a")
    b = write(tmp_path / "b")
    assert main([str(tmp_path / "a"), str(b)]) == 0


@pytest.mark.parametrize("damage, text", [
    (lambda step: (step / "fthsdp.pt").write_bytes(b"not the file the marker names"), "fails its checksum"),
    (lambda step: step.rename(step.parent / "elsewhere"), "no complete checkpoint"),
])
def test_unreadable_checkpoints_exit_two_naming_why(tmp_path, capsys, damage, text):
    a, b = write(tmp_path / "a"), write(tmp_path / "b")
    damage(b)
    assert main([str(a), str(b if b.exists() else b.parent)]) == 2
    assert text in capsys.readouterr().err


def test_sharded_checkpoints_name_the_differing_ranks():
    """The abstraction a sharded reader fills: every rank's own shard under the same names."""
    shard = {k: {"model.w": torch.arange(4.0) + k, "optimizer.param_groups.0.lr": 0.1} for k in range(4)}
    other = {k: {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in s.items()} for k, s in shard.items()}
    other[2]["model.w"][1] = float("nan")
    other[3]["optimizer.param_groups.0.lr"] = 0.2
    del other[1]["model.w"]
    c = compare(shard, other)
    assert c.differing_ranks == [1, 2, 3]
    kinds = {(d.rank, d.name): d.what for d in c.diffs}
    assert kinds == {(1, "model.w"): "missing_in_b", (2, "model.w"): "values",
                     (3, "optimizer.param_groups.0.lr"): "value"}
    assert "nan" in describe(c) and "0.1 != 0.2" in describe(c)


def test_signed_zero_and_dtype_changes_count():
    c = compare({0: {"t": torch.tensor([0.0])}}, {0: {"t": torch.tensor([-0.0])}})
    assert [(d.what, d.count) for d in c.diffs] == [("values", 1)]
    c = compare({0: {"t": torch.zeros(2)}}, {0: {"t": torch.zeros(2, dtype=torch.float64)}})
    assert c.diffs[0].what == "dtype"


def test_flatten_names_nested_optimizer_state():
    state = {"optimizer": {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2)}},
                           "param_groups": [{"lr": 0.1, "params": [0]}]}}
    assert set(flatten(state)) == {"optimizer.state.0.step", "optimizer.state.0.exp_avg",
                                   "optimizer.param_groups.0.lr", "optimizer.param_groups.0.params"}


def test_the_cli_subcommand_is_wired(tmp_path):
    a, b = write(tmp_path / "a"), write(tmp_path / "b", lambda m: flip_bit(m[0].bias, 0))
    done = subprocess.run([sys.executable, "-m", "fthsdp.cli", "compare-checkpoints", str(a), str(b)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "rank 0 model.0.bias" in done.stdout
    assert read_store_checkpoint(a)[0]["model.0.bias"].shape == (8,)
