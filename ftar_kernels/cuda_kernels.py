"""CUDA reduce kernels (CuPy RawKernel), compiled lazily on the first CUDA all-reduce.

`dst[i] += src[i]` where dst is device memory and src is pinned host memory read directly over
PCIe/NVLink-C2C (unified addressing), so no device staging copy is needed. Each thread keeps
UNROLL independent 16-byte loads in flight to hide the latency of reading host memory; the grid
is small (paper: 2 blocks x 512 threads) so the reduce leaves the GPU to the training kernels.
16-bit types are added in float32 and rounded to nearest even. No headers are included, so
NVRTC needs no CUDA include path.
"""

from __future__ import annotations

import threading

_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
#define UNROLL 4
__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ u16 f2bf(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}
__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ u32 one_float32(u32 a, u32 b) { return __float_as_uint(__uint_as_float(a) + __uint_as_float(b)); }
__device__ __forceinline__ u16 one_bfloat16(u16 a, u16 b) { return f2bf(bf2f(a) + bf2f(b)); }
__device__ __forceinline__ u16 one_float16(u16 a, u16 b) { return f2h(h2f(a) + h2f(b)); }
__device__ __forceinline__ u32 word_float32(u32 a, u32 b) { return one_float32(a, b); }
__device__ __forceinline__ u32 word_bfloat16(u32 a, u32 b) {
  return (u32)one_bfloat16((u16)a, (u16)b) | ((u32)one_bfloat16((u16)(a >> 16), (u16)(b >> 16)) << 16);
}
__device__ __forceinline__ u32 word_float16(u32 a, u32 b) {
  return (u32)one_float16((u16)a, (u16)b) | ((u32)one_float16((u16)(a >> 16), (u16)(b >> 16)) << 16);
}
"""

_PER_DTYPE = r"""
extern "C" __global__ void ftar_add_vec_NAME(uint4* __restrict__ dst, const uint4* __restrict__ src, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    uint4 a[UNROLL], b[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) { a[u] = dst[i + u * stride]; b[u] = src[i + u * stride]; }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      a[u].x = word_NAME(a[u].x, b[u].x); a[u].y = word_NAME(a[u].y, b[u].y);
      a[u].z = word_NAME(a[u].z, b[u].z); a[u].w = word_NAME(a[u].w, b[u].w);
      dst[i + u * stride] = a[u];
    }
  }
  for (; i < n; i += stride) {
    uint4 a = dst[i], b = src[i];
    a.x = word_NAME(a.x, b.x); a.y = word_NAME(a.y, b.y); a.z = word_NAME(a.z, b.z); a.w = word_NAME(a.w, b.w);
    dst[i] = a;
  }
}
extern "C" __global__ void ftar_add_one_NAME(ELEM* __restrict__ dst, const ELEM* __restrict__ src, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = one_NAME(dst[i], src[i]);
}
"""

_ELEM = {"float32": "u32", "bfloat16": "u16", "float16": "u16"}
#: NVRTC options of the runtime's compile (tests compile the same source with nvcc and these).
COMPILE_OPTIONS = ("--std=c++14",)
_lock = threading.Lock()
_module = None


def kernel_source() -> str:
    """The exact CUDA C++ source the runtime compiles: helpers, then two kernels per dtype
    (`ftar_add_vec_<dtype>` on 16-byte words, `ftar_add_one_<dtype>` for the tail)."""
    return _SOURCE + "".join(_PER_DTYPE.replace("NAME", name).replace("ELEM", elem) for name, elem in _ELEM.items())


def kernel_names() -> list[str]:
    return [f"ftar_add_{kind}_{name}" for name in _ELEM for kind in ("vec", "one")]


def _load():
    global _module
    with _lock:
        if _module is None:
            import cupy  # lazy: only CUDA tensors need it

            _module = cupy.RawModule(code=kernel_source(), options=COMPILE_OPTIONS)
        return _module


class ReduceKernels:
    """Launches `dst += src` for one dtype on one stream with a fixed grid."""

    def __init__(self, dtype_name: str, blocks: int, threads: int, stream_ptr: int, device: int) -> None:
        import cupy
        import numpy

        self._np = numpy
        module = _load()
        self._vec = module.get_function(f"ftar_add_vec_{dtype_name}")
        self._one = module.get_function(f"ftar_add_one_{dtype_name}")
        self._grid, self._block = (blocks,), (threads,)
        self._device = cupy.cuda.Device(device)
        self._stream = cupy.cuda.ExternalStream(stream_ptr, device)

    def add(self, dst_ptr: int, src_ptr: int, nbytes: int, elem_size: int) -> None:
        """Enqueue dst += src on the stream (returns before the GPU finishes)."""
        np = self._np
        # RawKernel launches on CuPy's current stream: make it ours (an ExternalStream of torch's).
        with self._device, self._stream:
            n_vec = nbytes // 16 if dst_ptr % 16 == 0 and src_ptr % 16 == 0 else 0
            if n_vec:
                self._vec(self._grid, self._block, (np.uint64(dst_ptr), np.uint64(src_ptr), np.int64(n_vec)))
            done = n_vec * 16
            if done < nbytes:
                self._one(self._grid, self._block,
                          (np.uint64(dst_ptr + done), np.uint64(src_ptr + done),
                           np.int64((nbytes - done) // elem_size)))
