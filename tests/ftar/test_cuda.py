"""The CUDA data plane (CuPy kernel, pinned staging) against torch, when a GPU is present."""

from __future__ import annotations

import pytest
import torch

from .cluster import KEY, parallel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA device (and CuPy)")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_allreduce_matches_torch(dtype):
    pytest.importorskip("cupy")
    from ftar_kernels import FtarEndpoint, FtarSettings

    settings = FtarSettings(chunk_bytes=1 << 16, chunks_in_flight=2, timeout_s=10.0, auth_key=KEY)
    eps = [FtarEndpoint("127.0.0.1", 0, settings) for _ in range(3)]
    try:
        members = [e.address for e in eps]
        parallel(*[lambda e=e: e.configure("gpu", 1, members) for e in eps])
        xs = [torch.randint(-20, 21, (100_003,), device="cuda").to(dtype) for _ in eps]
        want = sum(x.double() for x in xs).to(dtype)
        handles = [e.allreduce(x) for e, x in zip(eps, xs)]
        for h in handles:
            h.wait(30.0)
        for x in xs:
            assert torch.equal(x, want)
    finally:
        parallel(*[e.close for e in eps])
