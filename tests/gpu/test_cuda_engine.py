"""The engine end to end on the GPU: the CUDA attention backend decodes the same greedy tokens as
the torch backend (float32, so near-ties cannot flip between two summation orders)."""

import gc

import pytest
import torch

pytest.importorskip("cupy")

from engine import LLM, SamplingParams  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village",
           "List three prime numbers:"]


def greedy_tokens(backend: str) -> tuple[str, list[list[int]]]:
    llm = LLM(model="default", device="cuda", dtype="float32", attention_backend=backend,
              max_num_seqs=8, max_model_len=2048)
    chosen = llm.engine.runner.attention_backend.name
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return chosen, [o.token_ids for o in outputs]


def test_cuda_backend_matches_torch_backend():
    torch_name, expected = greedy_tokens("torch")
    cuda_name, got = greedy_tokens("cuda")
    assert (torch_name, cuda_name) == ("torch", "cuda")
    assert got == expected


def test_auto_picks_the_kernels_on_cuda():
    assert greedy_tokens("auto")[0] == "cuda"
