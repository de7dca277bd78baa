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

Backends (`select_backend`, chosen once per engine and carried by the metadata): "torch" is the
path above; "cuda" writes K/V with the kernel reshape_and_cache and attends decodes with the kernel
paged_attention (engine/kernels.py, CuPy); prefill chunks stay on the torch path either way.
"""

from __future__ import annotations

from collections.abc import Callable
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
    # Decodes gather only as many blocks as the longest decode needs (built once per step):
    decode_block_tables: torch.Tensor | None = None  # [num_decodes, decode_blocks]
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, decode_blocks * block_size]
    backend: AttentionBackend | None = None  # None: the torch path

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor) -> None:
        """Store the step's K and V at self.slot_mapping with this step's backend."""
        (self.backend or TORCH_BACKEND).write_kv(k, v, k_cache, v_cache, self.slot_mapping)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_cpu)

    @classmethod
    def build(cls, block_tables: list[list[int]], context_lens: list[int], query_lens: list[int],
              slot_mapping: list[int], block_size: int, device: torch.device,
              backend: AttentionBackend | None = None) -> AttentionMetadata:
        """From per-sequence Python lists, decodes (query length 1) first."""
        num_decodes = sum(1 for n in query_lens if n == 1)
        assert all(n == 1 for n in query_lens[:num_decodes]), "decodes must come first"
        max_blocks = max(map(len, block_tables))
        padded = [t + [0] * (max_blocks - len(t)) for t in block_tables]
        query_start_loc = [0]
        for n in query_lens:
            query_start_loc.append(query_start_loc[-1] + n)
        ctx = torch.tensor(context_lens, dtype=torch.long, device=device)
        meta = cls(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
            block_tables=torch.tensor(padded, dtype=torch.long, device=device),
            context_lens=ctx, query_start_loc=query_start_loc, context_lens_cpu=list(context_lens),
            num_decodes=num_decodes, backend=backend,
        )
        if num_decodes:
            decode_blocks = max(map(len, block_tables[:num_decodes]))
            meta.decode_block_tables = meta.block_tables[:num_decodes, :decode_blocks]
            positions = torch.arange(decode_blocks * block_size, device=device)
            meta.decode_mask = (positions[None, :] < ctx[:num_decodes, None])[:, None, None, :]
        return meta


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
        out[:nd] = (meta.backend or TORCH_BACKEND).decode(q[:nd], k_cache, v_cache, meta, scale)
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


def _decode(q, k_cache, v_cache, meta, scale):
    block_tables, mask = meta.decode_block_tables, meta.decode_mask
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


@dataclass(frozen=True)
class AttentionBackend:
    """The two pieces of attention that have a CUDA kernel; everything else is shared."""

    name: str
    write_kv: Callable  # (k, v, k_cache, v_cache, slot_mapping) -> None
    decode: Callable  # (q [num_decodes, H, D], k_cache, v_cache, meta, scale) -> [num_decodes, H, D]


TORCH_BACKEND = AttentionBackend("torch", write_kv, _decode)


def select_backend(name: str, device: torch.device, head_dim: int, block_size: int) -> AttentionBackend:
    """"torch", "cuda" (the CuPy kernels; an error where they cannot run) or "auto" (the kernels
    where they can run: a CUDA device, CuPy importable, a head_dim and block_size they support)."""
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TORCH_BACKEND
    if device.type != "cuda":
        raise ValueError(f"attention backend {name!r} needs a CUDA device, got {device}")
    try:
        from engine import kernels
    except ImportError as exc:
        if name == "auto":
            return TORCH_BACKEND
        raise RuntimeError(f"attention backend 'cuda' needs CuPy ({exc}): "
                           f"pip install -e '.[cuda]'") from exc
    if head_dim not in kernels.HEAD_DIMS or block_size not in kernels.BLOCK_SIZES:
        if name == "auto":
            return TORCH_BACKEND
        raise ValueError(f"attention backend 'cuda' supports head_dim {kernels.HEAD_DIMS} and "
                         f"block_size {kernels.BLOCK_SIZES}, got {head_dim} and {block_size}")

    def cuda_write_kv(k, v, k_cache, v_cache, slot_mapping):
        kernels.reshape_and_cache(k.contiguous(), v.contiguous(), k_cache, v_cache, slot_mapping)

    def cuda_decode(q, k_cache, v_cache, meta, scale):
        nd = meta.num_decodes
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        kernels.paged_attention(out, q.contiguous(), k_cache, v_cache, meta.block_tables[:nd],
                                meta.context_lens[:nd], scale,
                                max_context_len=max(meta.context_lens_cpu[:nd]))
        return out

    return AttentionBackend("cuda", cuda_write_kv, cuda_decode)
