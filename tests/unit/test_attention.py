"""Paged attention (torch path) equals dense causal attention, on scattered blocks."""

import torch
import torch.nn.functional as F

from engine.attention import AttentionMetadata, paged_attention, write_kv

BLOCK, KVH, H, D = 4, 2, 6, 8


def dense(q, k, v):
    """Reference: causal attention of the last len(q) positions over all of k/v, float64."""
    q, k, v = (x.double().transpose(0, 1) for x in (q, k, v))  # [heads, len, D]
    k = k.repeat_interleave(H // KVH, 0)
    v = v.repeat_interleave(H // KVH, 0)
    n, ctx = q.shape[1], k.shape[1]
    mask = torch.ones(n, ctx, dtype=torch.bool).tril(ctx - n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=D**-0.5).transpose(0, 1)


def run_case(specs, seed=0):
    """specs: (context_len_before, num_new_tokens) per sequence, decodes (1 new token) first."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = 64
    k_cache = torch.zeros(num_blocks, BLOCK, KVH, D)
    v_cache = torch.zeros(num_blocks, BLOCK, KVH, D)
    k_cache[0], v_cache[0] = 50.0, -50.0  # padding block garbage: must be masked out everywhere
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # scattered, never block 0
    full_k, full_v, tables, slots, qs = [], [], [], [], []
    for before, new in specs:
        total = before + new
        table = [free.pop() for _ in range(-(-total // BLOCK))]
        k = torch.randn(total, KVH, D, generator=g)
        v = torch.randn(total, KVH, D, generator=g)
        seq_slots = [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total)]
        write_kv(k[:before], v[:before], k_cache, v_cache, torch.tensor(seq_slots[:before], dtype=torch.long))
        full_k.append(k), full_v.append(v), tables.append(table)
        slots += seq_slots[before:]
        qs.append(torch.randn(new, H, D, generator=g))
    new_k = torch.cat([k[b:] for k, (b, _) in zip(full_k, specs)])
    new_v = torch.cat([v[b:] for v, (b, _) in zip(full_v, specs)])
    write_kv(new_k, new_v, k_cache, v_cache, torch.tensor(slots, dtype=torch.long))
    meta = AttentionMetadata.build(tables, [b + n for b, n in specs], [n for _, n in specs],
                                   slots, BLOCK, torch.device("cpu"))
    starts = meta.query_start_loc
    out = paged_attention(torch.cat(qs), k_cache, v_cache, meta, D**-0.5, new_k, new_v)
    for i, (q, k, v) in enumerate(zip(qs, full_k, full_v)):
        got = out[starts[i]:starts[i + 1]]
        torch.testing.assert_close(got.double(), dense(q, k, v), rtol=1e-5, atol=1e-5)


def test_decodes_with_ragged_contexts():
    run_case([(0, 1), (3, 1), (4, 1), (17, 1), (30, 1)])


def test_prefill_without_prefix():
    run_case([(0, 13)])


def test_prefill_chunk_after_cached_prefix_mixed_with_decodes():
    run_case([(9, 1), (2, 1), (8, 5), (0, 7), (13, 3)], seed=1)


def test_short_decodes_padded_beside_long_ones():
    run_case([(1, 1), (40, 1), (5, 1)], seed=2)
