"""SmolLM2 on CPU: token-identical to Hugging Face, batch-invariant, seeded, and safe on bad input."""

import math

import pytest
import torch

from engine import SamplingParams

GREEDY32 = SamplingParams(max_tokens=32, temperature=0.0)

PLAIN = [
    "The quick brown fox", "Once upon a time", "In 1492, Columbus", "def fibonacci(n):",
    "The mitochondria is", "Water boils at", "My favourite colour is", "The theory of relativity",
]


def test_greedy_matches_hugging_face_token_for_token(llm, hf_model, chat_prompts):
    prompts = chat_prompts[:4]
    ours = llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    for prompt, out in zip(prompts, ours):
        assert out.token_ids == hf_greedy(hf_model, llm.tokenizer.encode(prompt), 32), prompt
        assert len(out.token_ids) == 32 and out.finish_reason == "length"


@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """Plain greedy decoding with transformers' own KV cache, straight through EOS."""
    ids, past, out = torch.tensor([prompt_ids]), None, []
    for _ in range(num_tokens):
        result = model(ids, past_key_values=past, use_cache=True)
        past = result.past_key_values
        out.append(int(result.logits[0, -1].argmax()))
        ids = torch.tensor([[out[-1]]])
    return out


def test_batch_of_16_equals_each_prompt_alone(llm, chat_prompts):
    prompts = chat_prompts + PLAIN
    together = llm.generate(prompts, GREEDY32)
    for prompt, batched in zip(prompts, together):
        alone = llm.generate([prompt], GREEDY32)[0]
        assert batched.token_ids == alone.token_ids, prompt
        assert batched.finish_reason == alone.finish_reason


def test_outputs_carry_text_reason_and_prompt_length(llm, chat_prompts):
    out = llm.generate(chat_prompts[0], SamplingParams(max_tokens=32, temperature=0.0))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and out.token_ids[-1] == llm.tokenizer.eos_token_id
    assert out.num_prompt_tokens == len(llm.tokenizer.encode(chat_prompts[0]))


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llm, chat_prompts):
    seeded = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    others = SamplingParams(max_tokens=24, temperature=1.0)
    alone = llm.generate([chat_prompts[1]], seeded)[0]
    batch = llm.generate([chat_prompts[0], chat_prompts[1], chat_prompts[2]], [others, seeded, others])
    assert batch[1].token_ids == alone.token_ids
    again = llm.generate([chat_prompts[1]], seeded)[0]
    assert again.token_ids == alone.token_ids
    other_seed = llm.generate([chat_prompts[1]], SamplingParams(
        max_tokens=24, temperature=0.9, top_p=0.95, seed=4321, ignore_eos=True))[0]
    assert other_seed.token_ids != alone.token_ids


def test_logprobs_are_returned_for_each_token(llm, chat_prompts):
    out = llm.generate(chat_prompts[0], SamplingParams(max_tokens=4, temperature=0.0, logprobs=3))[0]
    assert len(out.logprobs) == len(out.token_ids)
    for token_id, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == token_id and lp.logprob <= 0
        assert len(lp.top) == 3 and lp.top[0][0] == token_id  # greedy picks the most likely
        assert math.isclose(lp.top[0][1], lp.logprob, rel_tol=1e-6)


@pytest.mark.parametrize("prompt, params, message", [
    ("", SamplingParams(), "prompt is empty"),
    ([], SamplingParams(), "prompt is empty"),
    ([1] * 9000, SamplingParams(), "max_model_len"),
    ([1, 49152], SamplingParams(), "out of the vocabulary"),
    ([1, -3], SamplingParams(), "out of the vocabulary"),
    ([1, 2], SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"),
])
def test_bad_prompts_are_rejected_and_leave_the_engine_clean(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["A good prompt", prompt], params)
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    bm = engine.scheduler.block_manager
    bm.check_integrity([])
    assert bm.usage == 0.0
    assert llm.generate(["Still alive"], SamplingParams(max_tokens=2))[0].token_ids


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0.0}, "top_p"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"logprobs": 100}, "logprobs"),
    ({"seed": -1}, "seed"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
