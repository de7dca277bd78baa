"""The Hugging Face `transformers` baseline on the same weights as the engine."""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM

from engine.weights import resolve_model_path


def load_hf_model(model: str, dtype: torch.dtype):
    path = resolve_model_path(model)
    if path.is_dir():
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    else:
        hf = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True)
    return hf.to(dtype).eval()


@torch.inference_mode()
def hf_generate_seconds(hf, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> float:
    """Wall time of one padded, static-batch greedy `generate` producing exactly max_new_tokens."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    hf.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    return time.perf_counter() - start
