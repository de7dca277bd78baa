"""Greedy outputs do not depend on how the scheduler slices the work.

Preemption (recompute), prefix caching, chunked prefill and static batching change which tokens run
in which step; none may change a single output token.
"""

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(llm, chat_prompts):
    return [o.token_ids for o in llm.generate(chat_prompts, GREEDY)]


def variant(**kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("kv_cache_memory_bytes", 64 << 20)
    return LLM(model="default", **kwargs)


def test_preemption_by_recompute_keeps_outputs(chat_prompts, reference):
    # 20 usable blocks of 16 tokens; 8 sequences of ~60 tokens need 32: some must be preempted.
    llm = variant(num_kv_blocks=21)
    outs = llm.generate(chat_prompts, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == reference
    assert llm.engine.scheduler.block_manager.num_free_blocks == 20


def test_prefix_caching_hits_and_keeps_outputs(chat_prompts, reference):
    llm = variant(enable_prefix_caching=True)
    first = llm.generate(chat_prompts, GREEDY)
    second = llm.generate(chat_prompts, GREEDY)  # every prompt is now cached but its last token
    bm = llm.engine.scheduler.block_manager
    assert bm.prefix_cache_hits > 0
    assert all(o.num_cached_tokens > 0 for o in second)
    assert [o.token_ids for o in first] == reference
    assert [o.token_ids for o in second] == reference


def test_no_prefix_caching_keeps_outputs(chat_prompts, reference):
    llm = variant(enable_prefix_caching=False)
    outs = llm.generate(chat_prompts, GREEDY)
    assert llm.engine.scheduler.block_manager.prefix_cache_hits == 0
    assert [o.token_ids for o in outs] == reference


def test_chunked_prefill_keeps_outputs(chat_prompts, reference):
    llm = variant(max_num_batched_tokens=16, max_num_seqs=8, enable_prefix_caching=False)
    outs = llm.generate(chat_prompts, GREEDY)
    assert min(o.num_prompt_tokens for o in outs) > 16
    assert [o.token_ids for o in outs] == reference


def test_static_batching_keeps_outputs(chat_prompts, reference):
    llm = variant(scheduling="static", max_num_seqs=3)
    outs = llm.generate(chat_prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
