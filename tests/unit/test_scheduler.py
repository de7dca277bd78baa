"""Scheduler with a fake model: exact per-step schedules, admission, eviction, preemption, aborts."""

import pytest

from engine.sequence import FinishReason, SequenceStatus
from tests.unit.harness import EOS, Driver, make_scheduler, plan


def test_finished_sequence_is_evicted_and_its_slot_refilled_on_the_next_step():
    d = Driver(make_scheduler(max_num_seqs=2))
    d.add("short", max_tokens=1)
    d.add("long", max_tokens=3)
    d.add("late", max_tokens=2)
    assert plan(d.step()) == [("short", 4), ("long", 4)]  # both prefill; "short" is done
    assert [s.request_id for s in d.finished] == ["short"]
    assert plan(d.step()) == [("long", 1), ("late", 4)]  # "late" takes the freed slot at once
    assert plan(d.step()) == [("long", 1), ("late", 1)]
    assert plan(d.step()) == []
    assert [s.request_id for s in d.finished] == ["short", "long", "late"]
    assert [s.num_output_tokens for s in d.finished] == [1, 3, 2]
    assert d.scheduler.block_manager.num_free_blocks == 63


def test_outputs_are_appended_and_blocks_follow_the_tokens():
    d = Driver(make_scheduler(block_size=4))
    a = d.add("a", num_prompt_tokens=3, max_tokens=3)
    d.step()
    assert a.token_ids == [10, 11, 12, 1003] and a.num_computed_tokens == 3
    assert a.block_table == [1]
    d.step()  # computes token 3 (slot 3 of block 1), samples token 4
    assert a.block_table == [1] and a.num_computed_tokens == 4
    d.step()  # computes token 4, which needs block 2
    assert a.block_table == [] and a.output_token_ids == [1003, 1004, 1005]
    assert a.finish_reason is FinishReason.LENGTH


def test_max_num_seqs_caps_admission_in_arrival_order():
    d = Driver(make_scheduler(max_num_seqs=2))
    for name in "abc":
        d.add(name, max_tokens=2)
    assert plan(d.step()) == [("a", 4), ("b", 4)]
    assert [s.request_id for s in d.scheduler.waiting] == ["c"]


def test_long_prompt_is_chunked_and_decodes_go_first():
    d = Driver(make_scheduler(max_num_batched_tokens=8, max_num_seqs=4))
    d.add("dec", num_prompt_tokens=2, max_tokens=5)
    d.step()
    d.add("long", num_prompt_tokens=20, max_tokens=2)
    assert plan(d.step()) == [("dec", 1), ("long", 7)]  # decode first, the rest of the budget
    out = d.step()
    assert plan(out) == [("dec", 1), ("long", 7)]
    assert [e.samples for e in out.scheduled] == [True, False]  # an unfinished chunk samples nothing
    assert plan(d.step()) == [("dec", 1), ("long", 6)]  # last chunk samples the first token
    assert plan(d.step()) == [("dec", 1), ("long", 1)]


def test_static_scheduling_admits_only_when_the_batch_is_empty():
    d = Driver(make_scheduler(max_num_seqs=2, scheduling="static"))
    d.add("short", max_tokens=1)
    d.add("long", max_tokens=3)
    d.add("late", max_tokens=1)
    assert plan(d.step()) == [("short", 4), ("long", 4)]
    assert plan(d.step()) == [("long", 1)]  # "short" left, but its slot stays empty
    assert plan(d.step()) == [("long", 1)]
    assert plan(d.step()) == [("late", 4)]


def test_preemption_frees_the_latest_arrival_and_recomputes_it():
    # 4 usable blocks of 4 tokens: two sequences of 8 tokens fill the cache.
    d = Driver(make_scheduler(num_kv_blocks=5, block_size=4, max_model_len=16))
    a = d.add("a", num_prompt_tokens=8, max_tokens=4)
    b = d.add("b", num_prompt_tokens=8, max_tokens=4)
    assert plan(d.step()) == [("a", 8), ("b", 8)]
    out = d.step()  # both need a 3rd block for their 9th token; only "a" can have one
    assert [s.request_id for s in out.preempted] == ["b"]
    assert plan(out) == [("a", 1)]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert b.output_token_ids == [1008]  # kept: recomputed, not resampled
    assert d.scheduler.waiting[0] is b and d.scheduler.num_preemptions == 1
    while d.scheduler.has_unfinished():
        d.step()
    assert a.output_token_ids == [1008, 1009, 1010, 1011]
    assert b.output_token_ids == [1008, 1009, 1010, 1011]
    assert b.num_preemptions >= 1
    assert d.scheduler.block_manager.num_free_blocks == 4


def test_preempted_request_goes_back_ahead_of_newer_ones():
    d = Driver(make_scheduler(num_kv_blocks=5, block_size=4, max_model_len=16))
    d.add("a", num_prompt_tokens=8, max_tokens=4)
    d.add("b", num_prompt_tokens=8, max_tokens=4)
    d.step()
    d.add("c", num_prompt_tokens=2, max_tokens=1)
    out = d.step()
    assert [s.request_id for s in out.preempted] == ["b"]
    assert [s.request_id for s in d.scheduler.waiting] == ["b", "c"]


def test_priority_policy_orders_the_queue_and_picks_the_victim():
    d = Driver(make_scheduler(max_num_seqs=1, policy="priority"))
    d.add("low", priority=5, max_tokens=1)
    d.add("high", priority=-1, max_tokens=1)
    d.add("mid", priority=0, max_tokens=1)
    order = [plan(d.step())[0][0] for _ in range(3)]
    assert order == ["high", "mid", "low"]


def test_abort_frees_blocks_immediately_waiting_or_running():
    d = Driver(make_scheduler(max_num_seqs=1))
    a = d.add("a", max_tokens=8)
    b = d.add("b", max_tokens=8)
    d.step()
    assert a.block_table and not b.block_table
    assert d.scheduler.abort("a") is a
    assert a.finish_reason is FinishReason.ABORTED and a.block_table == []
    assert d.scheduler.block_manager.num_free_blocks == 63
    assert d.scheduler.abort("b") is b and not d.scheduler.has_unfinished()
    assert d.scheduler.abort("a") is None  # unknown now
    d.scheduler.block_manager.check_integrity([])


def test_stop_conditions():
    d = Driver(make_scheduler(max_model_len=12))
    eos = d.add("eos", max_tokens=8)
    ignore = d.add("ignore", max_tokens=3, ignore_eos=True)
    stop = d.add("stop", max_tokens=8, stop_token_ids=[7])
    maxlen = d.add("maxlen", num_prompt_tokens=10, max_tokens=8)

    def sample(seq):
        return {"eos": EOS, "ignore": EOS, "stop": 7}.get(seq.request_id, 1)

    while d.scheduler.has_unfinished():
        d.step(sample)
    assert (eos.finish_reason, eos.num_output_tokens) == (FinishReason.STOP, 1)
    assert (ignore.finish_reason, ignore.num_output_tokens) == (FinishReason.LENGTH, 3)
    assert (stop.finish_reason, stop.num_output_tokens) == (FinishReason.STOP, 1)
    assert (maxlen.finish_reason, maxlen.num_tokens) == (FinishReason.LENGTH, 12)


def test_prefix_cache_hit_skips_computed_tokens():
    d = Driver(make_scheduler(block_size=4))
    d.add("a", num_prompt_tokens=9, max_tokens=1)
    d.step()
    b = d.add("b", num_prompt_tokens=9, max_tokens=1)
    assert plan(d.step()) == [("b", 1)]  # 8 of 9 prompt tokens come from the cache
    assert b.num_cached_tokens == 8
    bm = d.scheduler.block_manager
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (18, 8)


def test_duplicate_request_id_is_rejected():
    d = Driver(make_scheduler())
    d.add("a")
    with pytest.raises(ValueError, match="already"):
        d.add("a")


def test_static_batch_is_formed_whole_even_past_the_token_budget():
    d = Driver(make_scheduler(max_num_seqs=3, max_num_batched_tokens=6, scheduling="static"))
    for name in "abcd":
        d.add(name, num_prompt_tokens=4, max_tokens=2)
    out = d.step()
    assert plan(out) == [("a", 4), ("b", 2)]
    assert [s.request_id for s in out.admitted] == ["a", "b", "c"]  # c joins with 0 tokens
    assert plan(d.step()) == [("a", 1), ("b", 2), ("c", 3)]
    assert plan(d.step()) == [("b", 1), ("c", 1)]
    assert plan(d.step()) == [("c", 1)]
    assert plan(d.step()) == [("d", 4)]  # the next batch opens only when the last one is done
