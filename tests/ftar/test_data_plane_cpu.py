"""The CPU data plane's piece arithmetic: a table of chunk / piece / dtype cases."""

from __future__ import annotations

import pytest
import torch

from ftar_kernels.data_plane_cpu import CpuDataPlane


@pytest.mark.parametrize("fold_bytes,dtype,lo,hi,want", [
    (64, torch.float32, 0, 40, [(0, 16), (16, 32), (32, 40)]),     # 16 floats a piece, a short last one
    (64, torch.bfloat16, 8, 72, [(8, 40), (40, 72)]),              # 32 halves a piece
    (4096, torch.float32, 5, 9, [(5, 9)]),                         # smaller than a piece
    (1 << 20, torch.float32, 0, 100, [(0, 100)]),                  # the piece is capped at the chunk
])
def test_reduce_scatter_chunks_arrive_in_pieces_of_the_staging_size(fold_bytes, dtype, lo, hi, want):
    plane = CpuDataPlane(chunk_bytes=4096, fold_bytes=fold_bytes)
    plane.begin(torch.zeros(128, dtype=dtype))
    assert list(plane.pieces(lo, hi, True)) == want
    assert list(plane.pieces(lo, hi, False)) == [(lo, hi)]  # all-gather: straight into the tensor


def test_every_piece_is_folded_into_its_own_place():
    plane = CpuDataPlane(chunk_bytes=4096, fold_bytes=64)
    flat = torch.ones(40)
    plane.begin(flat)
    for a, b in plane.pieces(0, 40, True):
        view = plane.recv_view(0, a, b, True)
        view[:] = torch.arange(a, b, dtype=torch.float32).view(torch.uint8).numpy().tobytes()
        plane.received(0, a, b, True)
    plane.finish()
    assert torch.equal(flat, torch.arange(40, dtype=torch.float32) + 1)
