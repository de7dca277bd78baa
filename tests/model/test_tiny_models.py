"""Paged attention through the whole model equals Hugging Face's dense attention.

Tiny random Llama and Qwen2 (QKV bias) checkpoints are written as Hugging Face directories; the
engine loads them like any model and must produce the same greedy tokens as transformers, with
prefills chunked across steps, decodes batched, and a block size that splits every sequence.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from tests.model.test_generation import hf_greedy

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def save_tiny(tmp_path, kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False, rope_theta=10000.0))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True))
    with torch.no_grad():  # sharper logits than the default init, so greedy choices are clear-cut
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(tmp_path / kind, safe_serialization=True)
    return tmp_path / kind, model.eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_engine_matches_dense_attention(tmp_path, kind):
    path, hf = save_tiny(tmp_path, kind)
    core = EngineCore(EngineConfig(model=str(path), block_size=4, max_num_batched_tokens=16,
                                   max_num_seqs=4, num_kv_blocks=80, cpu_linear="mkl"))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 7, 23, 40)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    for i, p in enumerate(prompts):
        core.add_request(str(i), p, params)
    tokens = {str(i): [] for i in range(len(prompts))}
    logprobs = {str(i): [] for i in range(len(prompts))}
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens[delta.request_id] += delta.new_token_ids
            logprobs[delta.request_id] += [lp.logprob for lp in delta.new_logprobs]
    for i, p in enumerate(prompts):
        assert tokens[str(i)] == hf_greedy(hf, p, 12), f"prompt {i} ({len(p)} tokens)"
        # The logprob of every chosen token, against one dense forward over the whole sequence.
        full = torch.tensor([p + tokens[str(i)]])
        with torch.inference_mode():
            ref = hf(full).logits[0].log_softmax(-1)  # [len, vocab]
        positions = torch.arange(len(p) - 1, full.shape[1] - 1)
        expected = ref[positions, full[0, len(p):]]
        torch.testing.assert_close(torch.tensor(logprobs[str(i)]), expected, rtol=0, atol=2e-4)
