"""Every kernel instantiation compiles with NVRTC, for sm_80 and sm_90, without a GPU.

CuPy's usual compile path asks the driver for the device's architecture, so this drives NVRTC
through CuPy's low-level bindings with an explicit --gpu-architecture. cuda_fp16.h/cuda_bf16.h
come from the CUDA runtime headers that cuda-pathfinder finds (the nvidia-cuda-runtime-cu12 wheel
of the `test` and `cuda` extras, or a system toolkit).
"""

import pytest

pytest.importorskip("cupy")

from cuda.pathfinder import find_nvidia_header_directory  # noqa: E402  (a dependency of cupy)
from cupy.cuda import nvrtc  # noqa: E402

from engine import kernels  # noqa: E402

ARCHS = ("sm_80", "sm_90")


def compile_cubin(file: str, names: list[str], arch: str) -> tuple[bytes, dict[str, str]]:
    headers = find_nvidia_header_directory("cudart")
    assert headers, "CUDA runtime headers not found: pip install nvidia-cuda-runtime-cu12"
    options = [f"--gpu-architecture={arch}", *kernels.OPTIONS, f"-I{headers}"]
    program = nvrtc.createProgram(kernels.source(file), file, [], [])
    try:
        for name in names:
            nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError:
            pytest.fail(f"{file} {names} for {arch}:\n{nvrtc.getProgramLog(program)}")
        return nvrtc.getCUBIN(program), {n: nvrtc.getLoweredName(program, n) for n in names}
    finally:
        nvrtc.destroyProgram(program)


def test_nvrtc_is_loadable():
    assert nvrtc.getVersion() >= (12, 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("file,ctype,head_dim,block_size", kernels.instantiations(),
                         ids=lambda v: str(v).replace(".cu", ""))
def test_kernel_compiles(file, ctype, head_dim, block_size, arch):
    names = kernels.name_expressions(file, ctype, head_dim, block_size)
    cubin, lowered = compile_cubin(file, names, arch)
    assert cubin
    for name, symbol in lowered.items():
        assert symbol.startswith("_Z") and symbol.encode() in cubin, (name, symbol)
