"""Paged attention over one flattened batch of tokens (torch path, CPU and GPU).

KV layout (shared with the CUDA kernels, see cuda/README.md), per layer, for K and for V:

    cache[num_blocks, block_size, num_kv_heads, head_dim]
    token t of a sequence lives in block block_table[t // block_size], row t % block_size;
    slot_mapping[i] = block * block_size + row is where the step's i-th token is written.

The step's tokens are ordered decodes first (one query token per sequence), then prefill chunks:

    tokens: [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]     num_decodes = 3
    query_start_loc:  0  1  2  3          7     9

Decodes are attended in one batched call over their gathered, padded context; each prefill chunk
attends causally to its cached prefix plus itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot each new K/V is written to
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with block 0
    context_lens: torch.Tensor  # [num_seqs] int64: tokens in the cache after this step's writes
    query_start_loc: list[int]  # [num_seqs + 1]: where each sequence's query tokens start
    context_lens_cpu: list[int]  # the same lengths as Python ints (no device sync per layer)
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, max_len] bool: key is in context

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_cpu)


def build_decode_mask(context_lens: torch.Tensor, block_size: int, max_blocks: int) -> torch.Tensor:
    positions = torch.arange(max_blocks * block_size, device=context_lens.device)
    return (positions[None, :] < context_lens[:, None])[:, None, None, :]  # [n, 1, 1, max_len]


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the step's K and V ([num_tokens, num_kv_heads, head_dim]) at their slots."""
    num_kv_heads, head_dim = k.shape[1:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k: torch.Tensor | None = None,  # this step's K/V [num_tokens, num_kv_heads, head_dim]: lets a
    v: torch.Tensor | None = None,  # prefill without cached prefix skip the gather
) -> torch.Tensor:
    """Attention of every query token over its sequence's cached context (already written)."""
    out = torch.empty_like(q)
    nd = meta.num_decodes
    if nd:
        num_blocks = meta.decode_mask.shape[-1] // k_cache.shape[1]
        tables = meta.block_tables[:nd, :num_blocks]
        out[:nd] = _decode(q[:nd], k_cache, v_cache, tables, meta.decode_mask, scale)
    for i in range(nd, meta.num_seqs):
        start, end = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        ctx_len = meta.context_lens_cpu[i]
        if k is not None and ctx_len == end - start:  # no cached prefix: attend to itself
            ks, vs = k[start:end], v[start:end]
        else:
            num_blocks = -(-ctx_len // k_cache.shape[1])
            table = meta.block_tables[i, :num_blocks]
            ks = k_cache[table].flatten(0, 1)[:ctx_len]  # [ctx_len, num_kv_heads, head_dim]
            vs = v_cache[table].flatten(0, 1)[:ctx_len]
        out[start:end] = _prefill(q[start:end], ks, vs, scale)
    return out


def _decode(q, k_cache, v_cache, block_tables, mask, scale):
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # Gather each sequence's blocks: [num_seqs, max_blocks, block_size, kv_heads, D]
    # -> [num_seqs, kv_heads, max_len, D]
    k = k_cache[block_tables].flatten(1, 2).transpose(1, 2)
    v = v_cache[block_tables].flatten(1, 2).transpose(1, 2)
    # Query heads that share a KV head form the "query length" axis: [num_seqs, kv_heads, group, D]
    qg = q.view(num_seqs, num_kv_heads, group, head_dim)
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return o.reshape(num_seqs, num_heads, head_dim)


def _prefill(q, k, v, scale):
    # q [q_len, heads, D]; k, v [ctx_len, kv_heads, D]; the queries are the last q_len positions.
    q_len, ctx_len = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q_len == ctx_len:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:  # causal, aligned bottom-right: query i sees keys <= ctx_len - q_len + i
        mask = torch.ones(q_len, ctx_len, dtype=torch.bool, device=q.device).tril(ctx_len - q_len)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)  # [q_len, heads, D]
