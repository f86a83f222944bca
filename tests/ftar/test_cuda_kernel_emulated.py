"""The CUDA reduce kernels' source, compiled for the CPU with g++ and run thread by thread.

No GPU is needed: CUDA built-ins are stubbed, the f16 PTX conversions are replaced by _Float16,
and every (block, thread) of a small grid runs in turn. This checks the unrolled vector loop, the
tail kernel and the bf16/f16 rounding against torch bit for bit. The real GPU run is
test_cuda.py / bench.ftar_gpu.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from ftar_kernels import cuda_kernels

#: `make test` installs g++ (Makefile `tools`); without it this fails and says so
GXX = shutil.which("g++")

PRELUDE = r"""
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
struct uint4 { unsigned int x, y, z, w; };
struct dim3 { unsigned int x, y, z; };
dim3 gridDim, blockDim, blockIdx, threadIdx;
static float __uint_as_float(unsigned int u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static unsigned int __float_as_uint(float f) { unsigned int u; __builtin_memcpy(&u, &f, 4); return u; }
"""
LAUNCH = r"""
extern "C" void run(int vec, int dt, void* d, const void* s, long long n, int blocks, int threads) {
  gridDim.x = blocks; blockDim.x = threads;
  for (unsigned b = 0; b < (unsigned)blocks; ++b) for (unsigned t = 0; t < (unsigned)threads; ++t) {
    blockIdx.x = b; threadIdx.x = t;
    if (vec) {
      if (dt == 0) ftar_add_vec_float32((uint4*)d, (const uint4*)s, n);
      if (dt == 1) ftar_add_vec_bfloat16((uint4*)d, (const uint4*)s, n);
      if (dt == 2) ftar_add_vec_float16((uint4*)d, (const uint4*)s, n);
    } else {
      if (dt == 0) ftar_add_one_float32((u32*)d, (const u32*)s, n);
      if (dt == 1) ftar_add_one_bfloat16((u16*)d, (const u16*)s, n);
      if (dt == 2) ftar_add_one_float16((u16*)d, (const u16*)s, n);
    }
  }
}
"""
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    code = cuda_kernels.kernel_source()
    code = code.replace('{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }',
                        "{ _Float16 x; __builtin_memcpy(&x, &h, 2); return (float)x; }")
    code = code.replace('{ u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }',
                        "{ _Float16 x = (_Float16)f; u16 h; __builtin_memcpy(&h, &x, 2); return h; }")
    assert "asm(" not in code, "the f16 conversions changed: update this emulation"
    code = code.replace('extern "C" __global__ void', 'extern "C" void')
    src, lib = tmp_path_factory.mktemp("kernels") / "k.cpp", None
    src.write_text(PRELUDE + code + LAUNCH)
    out = src.with_suffix(".so")
    assert GXX is not None, "the kernel emulation needs g++: run 'apt-get install g++' (make test does, as root)"
    result = subprocess.run([GXX, "-O1", "-shared", "-fPIC", "-std=c++17", "-o", str(out), str(src)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"g++ cannot build the kernel emulation: {result.stderr[-2000:]}"
    lib = ctypes.CDLL(str(out))
    lib.run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong,
                        ctypes.c_int, ctypes.c_int]
    return lib


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nbytes", [16, 16 * 37, 16 * 1000 + 6, 4096])
def test_kernels_match_torch_bit_for_bit(emulated, dtype, nbytes):
    es = torch.tensor([], dtype=dtype).element_size()
    n = nbytes // es
    gen = torch.Generator().manual_seed(nbytes)
    dst = (torch.randn(n, generator=gen) * 100).to(dtype)
    src = (torch.randn(n, generator=gen) * 100).to(dtype)
    want = (dst.float() + src.float()).to(dtype)
    n_vec = nbytes // 16  # the split ReduceKernels.add makes for 16-byte aligned buffers
    emulated.run(1, DTYPES.index(dtype), dst.data_ptr(), src.data_ptr(), n_vec, 2, 8)
    done = n_vec * 16
    if done < nbytes:
        emulated.run(0, DTYPES.index(dtype), dst.data_ptr() + done, src.data_ptr() + done,
                     (nbytes - done) // es, 2, 8)
    assert torch.equal(dst, want)
