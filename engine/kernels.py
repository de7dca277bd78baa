"""Thin CuPy launchers for the CUDA kernels in cuda/ (the only module that imports cupy).

Each launcher checks dtype, shape, contiguity and device of every tensor (errors name the tensor),
then launches on torch's current stream. Tensors cross to CuPy zero-copy by DLPack; scratch
buffers are torch allocations, so they follow torch's caching allocator and stream.

Kernels are compiled with NVRTC on first use, one module per (file, dtype, head_dim, block_size).
The shapes, layout, grid and block of each kernel are in the header comment of its .cu file.
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy
import numpy as np
import torch

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"
CTYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
HEAD_DIMS = (64, 128)
BLOCK_SIZES = (16,)
MAX_PARTITION_SIZE = 512  # kMaxPartitionSize in cuda/common.cuh (static shared memory)
PARTITION_SIZE = 512  # tokens per partition of paged_attention_partition
CACHE_THREADS = 256
PARTITION_THREADS = 128
OPTIONS = ("-std=c++17", f"-I{CUDA_DIR}")


def source(file: str) -> str:
    return (CUDA_DIR / file).read_text()


def name_expressions(file: str, ctype: str, head_dim: int, block_size: int) -> list[str]:
    """The template instantiations of `file` compiled for one (dtype, head_dim, block_size)."""
    if file == "reshape_and_cache.cu":
        return [f"reshape_and_cache<{ctype}>"]
    return [f"paged_attention_partition<{ctype}, {head_dim}, {block_size}>",
            f"paged_attention_reduce<{ctype}, {head_dim}>"]


def instantiations() -> list[tuple[str, str, int, int]]:
    """Every (file, ctype, head_dim, block_size) the launchers can ask for (the NVRTC test
    compiles them all)."""
    return [(file, ctype, head_dim, block_size)
            for file in ("reshape_and_cache.cu", "paged_attention.cu")
            for ctype in CTYPES.values() for head_dim in HEAD_DIMS for block_size in BLOCK_SIZES
            if file == "paged_attention.cu" or (head_dim, block_size) == (HEAD_DIMS[0], BLOCK_SIZES[0])]


@functools.cache
def _module(file: str, ctype: str, head_dim: int, block_size: int) -> cupy.RawModule:
    names = name_expressions(file, ctype, head_dim, block_size)
    module = cupy.RawModule(code=source(file), options=OPTIONS, name_expressions=names)
    module.compile()  # compile now, so a build error surfaces at the first call, not mid-step
    return module


def _function(file: str, dtype: torch.dtype, head_dim: int, block_size: int, index: int):
    ctype = CTYPES[dtype]
    names = name_expressions(file, ctype, head_dim, block_size)
    return _module(file, ctype, head_dim, block_size).get_function(names[index])


def _check(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple, device: torch.device) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _as_cupy(t: torch.Tensor) -> cupy.ndarray:
    # The kernel only sees a pointer; bfloat16 crosses as int16 bits, which every CuPy accepts.
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def _launch(kernel, grid: tuple, block: tuple, device: torch.device, args: tuple) -> None:
    """Launch on torch's current stream of `device`; tensors go by DLPack (no copy)."""
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device.index)
    with cupy.cuda.Device(device.index), stream:
        kernel(grid, block, tuple(_as_cupy(a) if isinstance(a, torch.Tensor) else a for a in args))


def _cache_shape(name: str, cache: torch.Tensor) -> tuple:
    if cache.dim() != 4:
        raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {tuple(cache.shape)}")
    return tuple(cache.shape)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store key/value [num_tokens, num_kv_heads, head_dim] at their slots of the caches
    [num_blocks, block_size, num_kv_heads, head_dim]; a negative slot skips the token."""
    device, dtype = key_cache.device, key_cache.dtype
    if device.type != "cuda":
        raise ValueError(f"key_cache must be on a CUDA device, got {device}")
    if dtype not in CTYPES:
        raise TypeError(f"key_cache dtype must be one of {list(CTYPES)}, got {dtype}")
    shape = _cache_shape("key_cache", key_cache)
    _check("key_cache", key_cache, dtype, shape, device)
    _check("value_cache", value_cache, dtype, shape, device)
    num_blocks, block_size, num_kv_heads, head_dim = shape
    num_tokens = key.shape[0]
    _check("key", key, dtype, (num_tokens, num_kv_heads, head_dim), device)
    _check("value", value, dtype, (num_tokens, num_kv_heads, head_dim), device)
    _check("slot_mapping", slot_mapping, torch.int64, (num_tokens,), device)
    if num_tokens == 0:
        return
    # The kernel is a plain copy whose template depends only on the dtype.
    kernel = _function("reshape_and_cache.cu", dtype, HEAD_DIMS[0], BLOCK_SIZES[0], 0)
    _launch(kernel, (num_tokens,), (CACHE_THREADS,), device,
            (key, value, key_cache, value_cache, slot_mapping,
             np.int32(num_kv_heads), np.int32(head_dim), np.int32(block_size)))


def paged_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, scale: float, max_context_len: int | None = None,
                    partition_size: int = PARTITION_SIZE) -> None:
    """Decode attention: out[s, h] = softmax(scale * q[s, h] . K[s]) @ V[s] over the first
    context_lens[s] tokens of sequence s's blocks. query, out [num_seqs, num_heads, head_dim].

    max_context_len (an upper bound is fine) sizes the partitions; None: the block table width
    (no device sync, but partitions past every context cost an early-exiting block each)."""
    device, dtype = query.device, query.dtype
    if device.type != "cuda":
        raise ValueError(f"query must be on a CUDA device, got {device}")
    if dtype not in CTYPES:
        raise TypeError(f"query dtype must be one of {list(CTYPES)}, got {dtype}")
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_dim], got shape {tuple(query.shape)}")
    num_seqs, num_heads, head_dim = query.shape
    shape = _cache_shape("key_cache", key_cache)
    num_blocks, block_size, num_kv_heads, _ = shape
    _check("query", query, dtype, (num_seqs, num_heads, head_dim), device)
    _check("out", out, dtype, (num_seqs, num_heads, head_dim), device)
    _check("key_cache", key_cache, dtype, (num_blocks, block_size, num_kv_heads, head_dim), device)
    _check("value_cache", value_cache, dtype, shape, device)
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be [num_seqs, max_blocks_per_seq], got shape "
                         f"{tuple(block_tables.shape)}")
    max_blocks_per_seq = block_tables.shape[1]
    _check("block_tables", block_tables, torch.int64, (num_seqs, max_blocks_per_seq), device)
    _check("context_lens", context_lens, torch.int64, (num_seqs,), device)
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if partition_size % block_size or not 0 < partition_size <= MAX_PARTITION_SIZE:
        raise ValueError(f"partition_size must be a multiple of block_size ({block_size}) and at "
                         f"most {MAX_PARTITION_SIZE}, got {partition_size}")
    if num_seqs == 0:
        return
    if max_context_len is None:
        max_context_len = max_blocks_per_seq * block_size
    max_num_partitions = max(1, -(-max_context_len // partition_size))
    exp_sums = torch.empty(num_seqs, num_heads, max_num_partitions, dtype=torch.float32, device=device)
    max_logits = torch.empty_like(exp_sums)
    partial_out = torch.empty(num_seqs, num_heads, max_num_partitions, head_dim,
                              dtype=torch.float32, device=device)
    partition = _function("paged_attention.cu", dtype, head_dim, block_size, 0)
    reduce = _function("paged_attention.cu", dtype, head_dim, block_size, 1)
    _launch(partition, (num_heads, num_seqs, max_num_partitions), (PARTITION_THREADS,), device,
            (exp_sums, max_logits, partial_out, query, key_cache, value_cache, block_tables,
             context_lens, np.int32(max_blocks_per_seq), np.int32(num_heads),
             np.int32(num_kv_heads), np.float32(scale), np.int32(max_num_partitions),
             np.int32(partition_size)))
    _launch(reduce, (num_heads, num_seqs), (head_dim,), device,
            (out, exp_sums, max_logits, partial_out, context_lens, np.int32(num_heads),
             np.int32(max_num_partitions), np.int32(partition_size)))
