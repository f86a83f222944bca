"""On a GPU: two replicas share one device, FSDP2 over NCCL inside each, FTAR across them on CUDA
tensors (CuPy reduce kernel, pinned staging), a rank SIGKILLed mid-backward, catch-up from the
survivor's pinned host snapshot. Runs only where a CUDA device is lent (and CuPy installed).

float32 shards reduce in place on the device; bfloat16 parameters and gradients travel as
float32 (one rounding back at the end). The CPU suite covers the same paths with Gloo.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster, Faults

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_replicas_on_one_gpu_recover_a_sigkilled_rank_bitwise(tmp_path, dtype):
    import cupy  # noqa: F401 - FTAR's CUDA data plane needs it: fail here, by name, when it is missing

    cluster = Cluster(tmp_path, replicas=2, ranks=1, steps=6, join_timeout_s=10.0,
                      worker={"fsdp": True, "cuda": True, "dtype": dtype, "digest_every": 1},
                      faults=Faults().sigkill(replica=1, at_step=3))
    rec = cluster.run(timeout_s=240.0)
    assert [(k["replica"], k["step"]) for k in rec.where(event="killed")] == [("1", 3)]
    first = hc.check_restarted_replica_caught_up(rec, "1", sharded=True)
    assert first["source"] == "0" and first["fetched_bytes"] > 0
    assert hc.check_bitwise_identical_after_every_commit(rec, sharded=True) >= 6
    hc.check_exactly_once(rec, replicas=2)
