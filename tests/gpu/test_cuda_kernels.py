"""The CUDA kernels (through engine/kernels.py) against plain-torch references, on the device.

Errors are measured relative to max |reference| (fp32 1e-5, fp16 2e-3, bf16 1e-2); outputs are
poisoned before each launch so a row the kernel forgets to write cannot pass.
"""

import pytest
import torch

from engine.attention import write_kv

kernels = pytest.importorskip("engine.kernels")  # needs CuPy

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
BLOCK = 16


def close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = (got.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    assert err <= TOLERANCE[dtype] * scale, f"max error {err:.3g} vs max |ref| {scale:.3g}"


def make_cache(num_blocks, num_kv_heads, head_dim, dtype, g):
    shape = (num_blocks, BLOCK, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g, device="cuda").to(dtype)
    v_cache = torch.randn(shape, generator=g, device="cuda").to(dtype)
    k_cache[0], v_cache[0] = 50.0, -50.0  # padding block: must never be attended
    return k_cache, v_cache


def tables_for(context_lens, num_blocks, width, g):
    """Scattered blocks (never block 0) per sequence, padded with block 0 to `width`."""
    free = (torch.randperm(num_blocks - 1, generator=g, device="cuda") + 1).tolist()
    tables = []
    for n in context_lens:
        table = [free.pop() for _ in range(-(-n // BLOCK))]
        tables.append(table + [0] * (width - len(table)))
    return torch.tensor(tables, dtype=torch.long, device="cuda")


def reference(q, k_cache, v_cache, tables, context_lens, scale):
    """Per sequence: gather its context, dense softmax attention in float64 (GQA by repeat)."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    out = []
    for s, n in enumerate(context_lens):
        k = k_cache[tables[s]].flatten(0, 1)[:n].double()  # [n, kv_heads, D]
        v = v_cache[tables[s]].flatten(0, 1)[:n].double()
        k = k.repeat_interleave(num_heads // num_kv_heads, 1)
        v = v.repeat_interleave(num_heads // num_kv_heads, 1)
        logits = torch.einsum("hd,nhd->hn", q[s].double(), k) * scale
        out.append(torch.einsum("hn,nhd->hd", logits.softmax(-1), v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (32, 8, 128), (4, 4, 64)])
@pytest.mark.parametrize("partition_size", [512, 64, 16])
def test_paged_attention_matches_reference(dtype, num_heads, num_kv_heads, head_dim, partition_size):
    g = torch.Generator("cuda").manual_seed(0)
    context_lens = [1, 15, 16, 17, 100, 511, 512, 513, 1300]
    width = -(-max(context_lens) // BLOCK) + 3  # wider than needed: padding entries are block 0
    num_blocks = sum(-(-n // BLOCK) for n in context_lens) + 8
    k_cache, v_cache = make_cache(num_blocks, num_kv_heads, head_dim, dtype, g)
    tables = tables_for(context_lens, num_blocks, width, g)
    lens = torch.tensor(context_lens, dtype=torch.long, device="cuda")
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=g, device="cuda").to(dtype)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    kernels.paged_attention(out, q, k_cache, v_cache, tables, lens, scale,
                            max_context_len=max(context_lens), partition_size=partition_size)
    close(out, reference(q, k_cache, v_cache, tables, context_lens, scale), dtype)
    out.fill_(float("nan"))  # the default max_context_len: the block table width
    kernels.paged_attention(out, q, k_cache, v_cache, tables, lens, scale, partition_size=partition_size)
    close(out, reference(q, k_cache, v_cache, tables, context_lens, scale), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(3, 64), (8, 128)])
def test_reshape_and_cache_matches_write_kv(dtype, num_kv_heads, head_dim):
    g = torch.Generator("cuda").manual_seed(1)
    num_blocks, num_tokens = 12, 40
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, device="cuda").to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, device="cuda").to(dtype)
    slots = torch.randperm(num_blocks * BLOCK, generator=g, device="cuda")[:num_tokens]
    shape = (num_blocks, BLOCK, num_kv_heads, head_dim)
    k_cache = torch.full(shape, 123.0, dtype=dtype, device="cuda")  # poison: untouched rows stay
    v_cache = torch.full(shape, -123.0, dtype=dtype, device="cuda")
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kernels.reshape_and_cache(k, v, k_cache, v_cache, slots)
    write_kv(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    # Negative slots are skipped: the cache is untouched.
    kernels.reshape_and_cache(k * 2, v * 2, k_cache, v_cache, torch.full_like(slots, -1))
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_launchers_reject_bad_tensors_naming_them():
    q = torch.randn(2, 4, 64, device="cuda")
    cache = torch.zeros(4, BLOCK, 2, 64, device="cuda")
    tables = torch.ones(2, 2, dtype=torch.long, device="cuda")
    lens = torch.tensor([3, 5], device="cuda")
    out = torch.empty_like(q)
    with pytest.raises(TypeError, match="block_tables"):
        kernels.paged_attention(out, q, cache, cache, tables.int(), lens, 0.125)
    with pytest.raises(TypeError, match="out"):
        kernels.paged_attention(out.half(), q, cache, cache, tables, lens, 0.125)
    with pytest.raises(ValueError, match="query must be contiguous"):
        kernels.paged_attention(out, q.transpose(0, 1).contiguous().transpose(0, 1), cache, cache,
                                tables, lens, 0.125)
    with pytest.raises(ValueError, match="context_lens"):
        kernels.paged_attention(out, q, cache, cache, tables, lens[:1], 0.125)
    with pytest.raises(ValueError, match="value_cache must be on"):
        kernels.paged_attention(out, q, cache, cache.cpu(), tables, lens, 0.125)
    with pytest.raises(ValueError, match="partition_size"):
        kernels.paged_attention(out, q, cache, cache, tables, lens, 0.125, partition_size=1024)
    kv = torch.zeros(3, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.reshape_and_cache(kv, kv, cache, cache, torch.zeros(2, dtype=torch.long, device="cuda"))
