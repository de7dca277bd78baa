"""The CUDA kernels compile for the GPU (nvcc -cubin for sm_80 and sm_90) and stay NVRTC-clean.

Each kernel file is included into a generated .cu that takes the address of every instantiation
the launcher uses, which forces nvcc to compile them all. Skipped only where nvcc is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists()
                                else None)
TYPES = ["float", "__half", "__nv_bfloat16"]
HEAD_DIMS = [64, 128]
BLOCK_SIZE = 16
INSTANTIATIONS = {
    "reshape_and_cache.cu": [f"reshape_and_cache<{t}>" for t in TYPES],
    "paged_attention.cu": [f"paged_attention_partition<{t}, {d}, {BLOCK_SIZE}>" for t in TYPES
                           for d in HEAD_DIMS]
                          + [f"paged_attention_reduce<{t}, {d}>" for t in TYPES for d in HEAD_DIMS],
}
ALLOWED_INCLUDES = {'"common.cuh"', "<cuda_fp16.h>", "<cuda_bf16.h>"}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", sorted(INSTANTIATIONS))
def test_compiles_to_cubin(tmp_path, source, arch):
    names = INSTANTIATIONS[source]
    unit = tmp_path / "instantiate.cu"
    unit.write_text(f'#include "{source}"\n'
                    "void* turnstile_kernels[] = {\n"
                    + "".join(f"    (void*)&{name},\n" for name in names) + "};\n")
    cubin = tmp_path / f"{arch}.cubin"
    result = subprocess.run([NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "-I", str(CUDA_DIR),
                             str(unit), "-o", str(cubin)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert cubin.stat().st_size > 0
    # Every kernel is in the cubin under its mangled name (e.g. _Z17reshape_and_cacheIfEv...).
    image = cubin.read_bytes()
    for name in names:
        kernel = name.split("<")[0].encode()
        assert b"%d%s" % (len(kernel), kernel) in image
    mangled = set(re.findall(rb"_Z\d+(?:paged_attention_\w+|reshape_and_cache)I\w+", image))
    assert len(mangled) == len(names)


@pytest.mark.parametrize("source", sorted(INSTANTIATIONS) + ["common.cuh"])
def test_nvrtc_clean(source):
    """NVRTC has no libc headers: only the fp16/bf16 headers and our own may be included."""
    text = (CUDA_DIR / source).read_text()
    includes = set(re.findall(r"^\s*#\s*include\s+(\S+)", text, re.MULTILINE))
    assert includes <= ALLOWED_INCLUDES
    assert "INFINITY" not in text and "std::" not in text
