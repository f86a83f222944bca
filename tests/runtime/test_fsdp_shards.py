"""FSDP2 on 2 real ranks (Gloo): each rank holds half of the state, and the all-reduce hook
finishes later only what FSDP merely views after it (tests/runtime/fsdp_probe.py measures)."""

from __future__ import annotations

import json
import os

import pytest

from tests import forked
from tests.runtime.cluster import REPO, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    port = free_port()
    procs = [forked.start("tests.runtime.fsdp_probe", [str(port), str(rank), str(out / f"{rank}.json")],
                          log=out / f"{rank}.log", env=dict(os.environ), cwd=REPO, pipes=False) for rank in (0, 1)]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0, 0], [(out / f"{rank}.log").read_text()[-2000:] for rank in (0, 1)]
    return [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]


def test_each_rank_holds_half_of_the_parameters_and_optimizer_state(probe):
    full = probe[0]["full_param_bytes"]
    for rank in probe:
        # Dim-0 shards: 63 output rows become 32 + 31 (the parameters' storage is padded to 32
        # rows on both ranks); Adam's two moments follow the parameters' shards, unpadded.
        row = 256 * 4 + 4
        assert full / 2 <= rank["param_storage_bytes"] <= full / 2 + row, rank
        assert abs(rank["optim_storage_bytes"] - full) <= 2 * row, rank
        # what a catch-up of this rank moves: its own shards of both (and Adam's step counters)
        assert 1.5 * full - 4096 <= rank["catch_up_entry_bytes"] <= 1.5 * full + 4096, rank


def test_only_shards_fsdp_merely_views_afterwards_are_left_to_finish_later(probe):
    for rank in probe:
        d = rank["deferred"]
        assert d["float32"] == [["torch.float32", True]] * 2  # one group per layer (the root has none)
        # the second backward accumulates into existing gradients: FSDP adds right after the hook
        assert d["accumulating"] == [["torch.float32", True]] * 2 + [["torch.float32", False]] * 2
        # FSDP casts the output to the parameters' dtype, or divides it (float16), after the hook
        assert {deferred for _, deferred in d["bf16_compute_fp32_params"]} == {False}
        assert {deferred for _, deferred in d["bf16_params_fp32_reduce"]} == {False}
        assert {deferred for _, deferred in d["float16"]} == {False}
        assert "PyTorch's own HSDP" in rank["hsdp_refused"]
