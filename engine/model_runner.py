"""Turns a SchedulerOutput into tensors, runs the model over the paged KV cache, samples.

Owns the model weights and the KV cache tensors. The scheduler never sees a tensor; this class
never decides who runs.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, select_backend
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.models import onednn
from engine.models.llama import LlamaForCausalLM
from engine.sampler import Sampler, SamplerOutput
from engine.scheduler import ScheduledSequence, SchedulerOutput

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def plan_cache(config: EngineConfig, model_config: ModelConfig) -> CacheConfig:
    """How many KV blocks to allocate, and the effective max_model_len."""
    max_model_len = config.max_model_len or model_config.max_position_embeddings
    if max_model_len > model_config.max_position_embeddings:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's "
                         f"max_position_embeddings {model_config.max_position_embeddings}")
    bytes_per_block = (2 * model_config.num_hidden_layers * config.block_size
                       * model_config.num_key_value_heads * model_config.head_dim
                       * DTYPES[config.dtype].itemsize)
    num_blocks = config.num_kv_blocks or config.kv_cache_memory_bytes // bytes_per_block
    cache = CacheConfig(config.block_size, num_blocks, max_model_len)
    if cache.num_usable_blocks * config.block_size < max_model_len:
        raise ValueError(
            f"KV cache of {num_blocks} blocks x {config.block_size} tokens cannot hold one "
            f"sequence of max_model_len {max_model_len}: raise num_kv_blocks or "
            f"kv_cache_memory_bytes, or lower max_model_len")
    return cache


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig,
                 tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        if config.num_threads is not None and config.device == "cpu":
            torch.set_num_threads(config.num_threads)
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.cache_config = plan_cache(config, model_config)
        self.block_size = config.block_size
        # Chosen before loading weights, so a backend that cannot run fails fast.
        self.attention_backend = select_backend(config.attention_backend, self.device,
                                                model_config.head_dim, config.block_size)
        self.model = LlamaForCausalLM(model_config, self.cache_config.max_model_len)
        self.model.load_weights(tensors, source)
        self.model.to(device=self.device, dtype=self.dtype).eval()
        self.model.rotary.float()  # cos/sin tables stay fp32; cast per step
        if config.cpu_linear == "onednn" and onednn.available(self.device, self.dtype):
            onednn.pack_linears(self.model)
        shape = (self.cache_config.num_kv_blocks, config.block_size,
                 model_config.num_key_value_heads, model_config.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(model_config.num_hidden_layers)
        ]
        generator = torch.Generator(self.device).manual_seed(config.seed)
        self.sampler = Sampler(generator)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> SamplerOutput:
        """Run one step. Returns one sampled token per scheduled entry that samples, in
        `out.scheduled` order."""
        # Decodes (one query token) first, so attention can batch them in one call.
        order = sorted(range(len(out.scheduled)), key=lambda i: out.scheduled[i].num_new_tokens != 1)
        entries = [out.scheduled[i] for i in order]
        input_ids, positions, meta, sample_rows = self._prepare(entries)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        sampling = [e for e in entries if e.samples]
        if not sampling:
            return SamplerOutput(token_ids=[], logprobs=[])
        logits = self.model.compute_logits(hidden[sample_rows])
        result = self._sample(logits, sampling)
        # Back to scheduler order.
        rank = {id(e): r for r, e in enumerate(sampling)}
        in_order = [rank[id(e)] for e in out.scheduled if e.samples]
        return SamplerOutput([result.token_ids[r] for r in in_order],
                             [result.logprobs[r] for r in in_order])

    def _prepare(self, entries: list[ScheduledSequence]):
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        for e in entries:
            seq, start = e.seq, e.seq.num_computed_tokens
            end = start + e.num_new_tokens
            table = seq.block_table
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if e.samples:
                sample_rows.append(len(input_ids) - 1)
        meta = AttentionMetadata.build(
            block_tables=[e.seq.block_table for e in entries],
            context_lens=[e.seq.num_computed_tokens + e.num_new_tokens for e in entries],
            query_lens=[e.num_new_tokens for e in entries],
            slot_mapping=slots, block_size=bs, device=self.device, backend=self.attention_backend)
        dev = self.device
        return (torch.tensor(input_ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev), meta,
                torch.tensor(sample_rows, dtype=torch.long, device=dev))

    def _sample(self, logits: torch.Tensor, entries: list[ScheduledSequence]) -> SamplerOutput:
        seqs = [e.seq for e in entries]
        params = [s.params for s in seqs]
        for seq in seqs:
            if seq.params.seed is not None and seq.generator is None:
                seq.generator = torch.Generator(self.device).manual_seed(seq.params.seed)
        penalised = [p.has_penalties for p in params]
        prompts = [s.prompt_token_ids if pen else [] for s, pen in zip(seqs, penalised)]
        outputs = [s.output_token_ids if pen else [] for s, pen in zip(seqs, penalised)]
        return self.sampler(logits, params, prompts, outputs, [s.generator for s in seqs])
