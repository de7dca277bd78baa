"""The CUDA kernels in cuda/ run on the CPU and match a float64 torch reference.

The same .cu sources are compiled with g++ against tests/kernels/cuda_cpu.h (a small CUDA shim:
each block's threads are real threads, barriers and warp shuffles are real synchronisation) into a
shared library, loaded with ctypes. This checks indexing, reductions and the partition/reduce math
without a GPU; tests/kernels/test_nvcc.py checks that the sources also compile for the GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "cuda" / "common.cuh", ROOT / "cuda" / "reshape_and_cache.cu",
           ROOT / "cuda" / "paged_attention.cu", Path(__file__).with_name("cuda_cpu.h"),
           Path(__file__).with_name("cpu_harness.cpp")]
FLAGS = ["-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"]
BLOCK_SIZE = 16  # the BLOCK_SIZE the harness instantiates
DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}

VOID_P, I64_P, F32_P = ctypes.c_void_p, ctypes.POINTER(ctypes.c_longlong), ctypes.c_void_p
I32, F32 = ctypes.c_int, ctypes.c_float


@pytest.fixture(scope="session")
def lib() -> ctypes.CDLL:
    """Build the harness once; the library is cached by a hash of its sources and flags."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    path = Path(tempfile.gettempdir()) / f"turnstile-cuda-cpu-{digest.hexdigest()[:16]}.so"
    if not path.exists():
        tmp = path.with_suffix(f".{id(path)}.tmp")
        subprocess.run(["g++", *FLAGS, "-I", str(ROOT / "cuda"), "-I", str(SOURCES[3].parent),
                        str(SOURCES[4]), "-o", str(tmp)], check=True)
        tmp.replace(path)  # atomic: a concurrent session never loads a half-written library
    return ctypes.CDLL(str(path))


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    assert t.is_contiguous()
    return ctypes.c_void_p(t.data_ptr())


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


# ---- reshape_and_cache ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_writes_slots_and_skips_negative(lib, dtype):
    torch.manual_seed(0)
    num_blocks, num_kv_heads, head_dim = 6, 2, 64
    slot_mapping = torch.tensor([5, 16, -1, 17, 95, 0, -1, 40], dtype=torch.long)
    num_tokens = len(slot_mapping)
    key = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    cache_shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    key_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    value_cache = torch.full(cache_shape, float("nan"), dtype=dtype)

    getattr(lib, f"run_reshape_and_cache_{DTYPES[dtype]}")(
        ptr(key), ptr(value), ptr(key_cache), ptr(value_cache), ptr(slot_mapping),
        num_tokens, num_kv_heads, head_dim, BLOCK_SIZE)

    written = slot_mapping >= 0
    slots = slot_mapping[written]
    k_rows = key_cache.view(-1, num_kv_heads, head_dim)
    v_rows = value_cache.view(-1, num_kv_heads, head_dim)
    assert torch.equal(k_rows[slots], key[written])  # bit-exact copies
    assert torch.equal(v_rows[slots], value[written])
    untouched = torch.ones(len(k_rows), dtype=torch.bool)
    untouched[slots] = False
    assert k_rows[untouched].isnan().all() and v_rows[untouched].isnan().all()


# ---- paged attention --------------------------------------------------------------------------

def reference(query, key_cache, value_cache, block_tables, context_lens, scale):
    """float64 attention of each sequence's single query over its gathered context."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=torch.float64)
    for s, n in enumerate(context_lens.tolist()):
        t = torch.arange(n)
        blocks = block_tables[s, t // BLOCK_SIZE]
        k = key_cache[blocks, t % BLOCK_SIZE].double()  # [n, num_kv_heads, head_dim]
        v = value_cache[blocks, t % BLOCK_SIZE].double()
        group = num_heads // num_kv_heads
        k = k.repeat_interleave(group, dim=1)  # [n, num_heads, head_dim]
        v = v.repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,nhd->hn", query[s].double(), k) * scale
        out[s] = torch.einsum("hn,nhd->hd", logits.softmax(dim=-1), v)
    return out


def run_paged_attention(lib, dtype, head_dim, context_lens, num_heads, num_kv_heads,
                        partition_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_seqs = len(context_lens)
    blocks_per_seq = [math.ceil(n / BLOCK_SIZE) for n in context_lens]
    max_blocks = max(blocks_per_seq)
    # Every sequence gets its own shuffled physical blocks; block 0 is padding, unused blocks are
    # NaN so a read outside the context would poison the output.
    num_blocks = sum(blocks_per_seq) + 1
    physical = torch.randperm(num_blocks - 1, generator=gen) + 1
    block_tables = torch.zeros(num_seqs, max_blocks, dtype=torch.long)
    used = 0
    for s, n in enumerate(blocks_per_seq):
        block_tables[s, :n] = physical[used:used + n]
        used += n
    cache_shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    key_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    value_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    key_cache[0] = value_cache[0] = float("nan")
    for s, n in enumerate(context_lens):  # slots past the context in the last block
        if n % BLOCK_SIZE:
            last = block_tables[s, n // BLOCK_SIZE]
            key_cache[last, n % BLOCK_SIZE:] = value_cache[last, n % BLOCK_SIZE:] = float("nan")
    query = (2 * torch.randn(num_seqs, num_heads, head_dim, generator=gen)).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.long)
    scale = head_dim ** -0.5

    max_num_partitions = math.ceil(max(context_lens) / partition_size)
    stats_shape = (num_seqs, num_heads, max_num_partitions)
    exp_sums = torch.full(stats_shape, float("nan"))
    max_logits = torch.full(stats_shape, float("nan"))
    partial_out = torch.full((*stats_shape, head_dim), float("nan"))
    out = torch.full((num_seqs, num_heads, head_dim), float("nan"), dtype=dtype)

    getattr(lib, f"run_paged_attention_{DTYPES[dtype]}_{head_dim}")(
        ptr(out), ptr(exp_sums), ptr(max_logits), ptr(partial_out), ptr(query), ptr(key_cache),
        ptr(value_cache), ptr(block_tables), ptr(lens), I32(num_seqs), I32(num_heads),
        I32(num_kv_heads), I32(max_blocks), F32(scale), I32(max_num_partitions),
        I32(partition_size))

    for t in (out, exp_sums, max_logits, partial_out):
        assert not t.isnan().any()
    # Partitions past a sequence's context are marked empty.
    for s, n in enumerate(context_lens):
        live = math.ceil(n / partition_size)
        assert (max_logits[s, :, live:] == float("-inf")).all()
        assert (exp_sums[s, :, live:] == 0).all() and (partial_out[s, :, live:] == 0).all()
        assert (exp_sums[s, :, :live] >= 1).all()
    ref = reference(query, key_cache, value_cache, block_tables, lens, scale)
    return out, ref


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_attention_matches_reference(lib, dtype, head_dim):
    # Ragged lengths: one token, a partial block, exactly one block, one past it, several
    # partitions with a partial last block. GQA with 4 query heads per kv head.
    context_lens = [1, 15, 16, 17, 300, 1000]
    out, ref = run_paged_attention(lib, dtype, head_dim, context_lens, num_heads=8,
                                   num_kv_heads=2, partition_size=128)
    assert relative_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("partition_size", [16, 64, 512])
def test_paged_attention_mha_and_partition_sizes(lib, partition_size):
    context_lens = [3, 64, 65, 513]
    out, ref = run_paged_attention(lib, torch.float32, 64, context_lens, num_heads=4,
                                   num_kv_heads=4, partition_size=partition_size, seed=1)
    assert relative_error(out, ref) <= TOLERANCE[torch.float32]
