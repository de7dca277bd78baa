"""Llama-family decoder (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2) over a paged KV cache.

The whole batch is one flat run of tokens (no padding, no batch axis): `T` below is the number of
tokens in the step, H the query heads, KVH the key/value heads, D the head dim.
Weights use Hugging Face names on load; q/k/v and gate/up are fused into one matmul each.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, paged_attention
from engine.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        # Llama 3.1: stretch low frequencies by `factor`, keep high ones, blend in between.
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = torch.where(mid, blended, inv_freq)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, Hugging Face `rotate_half` layout (halves, not pairs)."""

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        super().__init__()
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), rope_inv_freq(config))
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_len, D]
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # [T, 1, D] each: broadcast over heads
        return self.cos[positions, None].to(dtype), self.sin[positions, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # [T, heads, D/2] each
    return torch.addcmul(x * cos, torch.cat([-x2, x1], dim=-1), sin)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        T, H, KVH, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qk, v = self.qkv_proj(x).split([(H + KVH) * D, KVH * D], dim=-1)
        qk = apply_rope(qk.view(T, H + KVH, D), cos, sin)  # [T, H + KVH, D]: q and k in one go
        q, k = qk.split([H, KVH], dim=1)  # [T, H, D], [T, KVH, D]
        v = v.reshape(T, KVH, D)
        meta.write_kv(k, v, k_cache, v_cache)
        o = paged_attention(q, k_cache, v_cache, meta, self.scale, k, v)  # [T, H, D]
        return self.o_proj(o.reshape(T, H * D))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_layernorm = nn.Parameter(torch.ones(config.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(config.hidden_size))
        self.self_attn = Attention(config)
        self.mlp = MLP(config)

    def forward(self, h, cos, sin, k_cache, v_cache, meta):
        x = F.rms_norm(h, h.shape[-1:], self.input_layernorm, self.eps)
        h = h + self.self_attn(x, cos, sin, k_cache, v_cache, meta)
        x = F.rms_norm(h, h.shape[-1:], self.post_attention_layernorm, self.eps)
        return h + self.mlp(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.rotary = RotaryEmbedding(config, max_len)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # one tensor, two roles

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (K, V) [blocks, bs, KVH, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary(positions, h.dtype)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            h = layer(h, cos, sin, k_cache, v_cache, meta)
        return h  # final norm is applied in compute_logits, only to the rows that sample

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(h, h.shape[-1:], self.norm, self.config.rms_norm_eps)
        return self.lm_head(h)  # [rows, vocab]

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Copy Hugging Face-named tensors into the fused parameters, checking every shape."""
        own = dict(self.named_parameters())

        def take(name: str) -> torch.Tensor:
            if name not in tensors:
                raise ValueError(f"{source}: tensor {name!r} is missing")
            return tensors[name]

        def put(param_name: str, value: torch.Tensor, what: str) -> None:
            param = own[param_name]
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"{source}: tensor {what!r} has shape {tuple(value.shape)}, "
                                 f"expected {tuple(param.shape)}")
            param.copy_(value)

        put("embed_tokens.weight", take("model.embed_tokens.weight"), "model.embed_tokens.weight")
        put("norm", take("model.norm.weight"), "model.norm.weight")
        if not self.config.tie_word_embeddings:
            put("lm_head.weight", take("lm_head.weight"), "lm_head.weight")
        for i in range(self.config.num_hidden_layers):
            src, dst = f"model.layers.{i}", f"layers.{i}"
            a = f"{src}.self_attn"
            put(f"{dst}.input_layernorm", take(f"{src}.input_layernorm.weight"), f"{src}.input_layernorm.weight")
            put(f"{dst}.post_attention_layernorm", take(f"{src}.post_attention_layernorm.weight"),
                f"{src}.post_attention_layernorm.weight")
            qkv = [take(f"{a}.{p}_proj.weight") for p in "qkv"]
            put(f"{dst}.self_attn.qkv_proj.weight", torch.cat(qkv), f"{a}.q/k/v_proj.weight")
            if self.config.attention_bias:
                bias = [take(f"{a}.{p}_proj.bias") for p in "qkv"]
                put(f"{dst}.self_attn.qkv_proj.bias", torch.cat(bias), f"{a}.q/k/v_proj.bias")
            put(f"{dst}.self_attn.o_proj.weight", take(f"{a}.o_proj.weight"), f"{a}.o_proj.weight")
            m = f"{src}.mlp"
            gate_up = torch.cat([take(f"{m}.gate_proj.weight"), take(f"{m}.up_proj.weight")])
            put(f"{dst}.mlp.gate_up_proj.weight", gate_up, f"{m}.gate/up_proj.weight")
            put(f"{dst}.mlp.down_proj.weight", take(f"{m}.down_proj.weight"), f"{m}.down_proj.weight")
