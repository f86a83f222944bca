"""The exact CUDA source the runtime loads compiles for Hopper (sm_90: H100/H200) with nvcc.

There is no GPU here, but CUDA's compiler is: a compile error, a missing kernel, a register
spill or a kernel too large for the paper's 512-thread blocks shows up in `make test` instead of
waiting for a device. The source is `cuda_kernels.kernel_source()`, the string the runtime
hands NVRTC, with the runtime's own options. The kernels' arithmetic is checked bit for bit in
test_cuda_kernel_emulated.py; the GPU run itself is test_cuda.py / bench.ftar_gpu.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ftar_kernels import cuda_kernels
from ftar_kernels.settings import FtarSettings

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs CUDA's compiler nvcc (no CUDA toolkit here)")

REGISTERS_PER_SM = 65536  # sm_90: 64K 32-bit registers per SM, so per block
MAX_THREADS_PER_BLOCK = 1024


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cubin")
    source, cubin = folder / "ftar_kernels.cu", folder / "ftar_kernels.cubin"
    source.write_text(cuda_kernels.kernel_source())
    result = subprocess.run([NVCC, "-cubin", "-arch=sm_90", *cuda_kernels.COMPILE_OPTIONS, "--resource-usage",
                             "-o", str(cubin), str(source)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"nvcc failed on the runtime's kernel source:\n{result.stderr[-3000:]}"
    return cubin.read_bytes(), result.stdout + result.stderr


def test_every_kernel_the_runtime_launches_is_in_the_cubin(compiled):
    cubin, _ = compiled
    for name in cuda_kernels.kernel_names():
        assert f".text.{name}".encode() in cubin, f"kernel {name} is missing from the sm_90 cubin"


def test_settings_do_not_allow_larger_blocks_than_checked_here():
    with pytest.raises(ValueError, match="cuda_threads_per_block"):
        FtarSettings(cuda_threads_per_block=MAX_THREADS_PER_BLOCK + 32).validate()


def test_kernels_do_not_spill_and_fit_every_block_size_the_settings_allow(compiled):
    _, report = compiled
    usage = dict(re.findall(r"Function properties for (\w+)\n\s+(.*?spill loads)", report))
    registers = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S))
    assert set(usage) >= set(cuda_kernels.kernel_names()), report
    threads = MAX_THREADS_PER_BLOCK  # FtarSettings accepts up to this (the default is 512)
    for name in cuda_kernels.kernel_names():
        assert "0 bytes spill stores, 0 bytes spill loads" in usage[name], f"{name} spills: {usage[name]}"
        assert int(registers[name]) * threads <= REGISTERS_PER_SM, (
            f"{name} uses {registers[name]} registers per thread: a {threads}-thread block does not fit an SM")
