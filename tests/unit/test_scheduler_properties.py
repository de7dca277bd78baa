"""Property tests: random workloads through the scheduler and block manager, fake model, no tensors.

A tiny KV cache (one max_model_len sequence fits, little more) forces preemption; small token
budgets force chunked prefill; prompts of one family share a prefix so the prefix cache hits.
Requests arrive between steps, some are aborted, some sample EOS. After every step we check the
invariants below; at the end, that everything drained, nothing leaked and every output is exactly
what the fake model produced for its positions (so recompute after preemption changed nothing).

A shadow KV cache stands in for the tensors. The K/V at position p depends on tokens 0..p, so a
scheduled chunk "writes" into each slot its block table names the tuple of tokens up to that
position, then "attends" by reading back every earlier position. A prefix-cache hit on the wrong
block (or on a block whose parent differs), a block reused while still referenced, or a write into
a shared block all show up as a read that is not the sequence's own context.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.block_manager import PAD_BLOCK_ID
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import FinishReason, Sequence, SequenceStatus
from tests.unit.harness import EOS, Driver, make_scheduler


@dataclass(frozen=True)
class Request:
    arrival_step: int  # added just before this step
    family: int  # prompts of one family share their first `num_shared_tokens` tokens:
    #              family 0 counts up, family 1 repeats one token (its blocks differ only by parent)
    num_prompt_tokens: int
    num_shared_tokens: int
    max_tokens: int
    priority: int = 0
    eos_at: int | None = None  # output index at which the fake model samples EOS
    ignore_eos: bool = True
    abort_step: int | None = None  # aborted just before this step, if still unfinished


@dataclass(frozen=True)
class Workload:
    block_size: int
    max_model_len: int
    num_kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str
    scheduling: str
    enable_prefix_caching: bool
    requests: tuple[Request, ...]


def request_id(i: int) -> str:
    return f"r{i}"


def prompt_tokens(i: int, req: Request) -> list[int]:
    shared = [10 + j if req.family == 0 else 110 for j in range(req.num_shared_tokens)]
    own = [600 + 20 * i + j for j in range(req.num_prompt_tokens - req.num_shared_tokens)]
    return shared + own


def fake_token(req: Request, seq: Sequence) -> int:
    """What the fake model samples: a pure function of the request and the position."""
    if req.eos_at == seq.num_output_tokens:
        return EOS
    return 1000 + seq.num_tokens


def expected_outputs(req: Request, max_model_len: int) -> tuple[list[int], FinishReason]:
    """The full output of a request that is not aborted, and why it ends."""
    n = min(req.max_tokens, max_model_len - req.num_prompt_tokens)
    tokens = [EOS if j == req.eos_at else 1000 + req.num_prompt_tokens + j for j in range(n)]
    if req.eos_at is not None and not req.ignore_eos and req.eos_at < n:
        return tokens[: req.eos_at + 1], FinishReason.STOP
    return tokens, FinishReason.LENGTH


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# -- workloads ----------------------------------------------------------------------------------

@st.composite
def workloads(draw) -> Workload:
    block_size = draw(st.integers(2, 4))
    max_model_len = draw(st.integers(4, 24))
    # Just enough blocks for one sequence of max_model_len (block 0 is padding), plus 0..3 spare.
    num_kv_blocks = ceil_div(max_model_len, block_size) + 1 + draw(st.integers(0, 3))
    requests = []
    for _ in range(draw(st.integers(1, 10))):
        num_prompt_tokens = draw(st.integers(1, min(20, max_model_len - 1)))
        max_tokens = draw(st.integers(1, 12))
        eos_at = None
        if draw(st.integers(0, 3)) == 3:
            eos_at = draw(st.integers(0, max_tokens - 1))
        arrival_step = draw(st.integers(0, 8))
        abort_step = None
        if draw(st.integers(0, 4)) == 4:
            abort_step = arrival_step + draw(st.integers(0, 15))
        requests.append(Request(
            arrival_step=arrival_step,
            family=draw(st.integers(0, 1)),
            num_prompt_tokens=num_prompt_tokens,
            num_shared_tokens=num_prompt_tokens - draw(st.integers(0, num_prompt_tokens)),
            max_tokens=max_tokens,
            priority=draw(st.integers(-1, 2)),
            eos_at=eos_at,
            ignore_eos=draw(st.booleans()) if eos_at is not None else True,
            abort_step=abort_step,
        ))
    max_num_seqs = draw(st.integers(1, 6))
    return Workload(
        block_size=block_size,
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=draw(st.integers(max_num_seqs, 32)),  # the engine requires >=
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        scheduling=draw(st.sampled_from(["continuous", "static"])),
        enable_prefix_caching=draw(st.booleans()),
        requests=tuple(requests),
    )


# -- the checker --------------------------------------------------------------------------------

@dataclass
class Before:
    """The scheduler's queues as a step starts."""
    running: list[Sequence]
    waiting: list[Sequence]
    decodes: set[str]  # running sequences with exactly one uncomputed token


class Checker:
    def __init__(self, w: Workload, scheduler: Scheduler) -> None:
        self.w = w
        self.scheduler = scheduler
        self.bm = scheduler.block_manager
        self.bs = w.block_size
        self.kv: dict[int, list[tuple | None]] = {}  # shadow KV: block id -> context per slot
        self.num_steps = 0
        self.num_preempted = 0
        self.num_steps_with_preemption = 0

    def hook(self) -> None:
        """Check every schedule() before the Driver applies it."""
        schedule = self.scheduler.schedule

        def checked_schedule() -> SchedulerOutput:
            running, waiting = list(self.scheduler.running), list(self.scheduler.waiting)
            decodes = {s.request_id for s in running if s.num_uncomputed_tokens == 1}
            before = Before(running, waiting, decodes)
            out = schedule()
            self.num_steps += 1
            self.check_schedule(before, out)
            self.check_victims(before, out)
            self.run_fake_model(out)
            return out

        self.scheduler.schedule = checked_schedule

    def check_schedule(self, before: Before, out: SchedulerOutput) -> None:
        w, sched = self.w, self.scheduler
        ids = [e.seq.request_id for e in out.scheduled]
        assert len(set(ids)) == len(ids), f"a sequence is scheduled twice: {ids}"
        assert all(e.num_new_tokens >= 1 for e in out.scheduled)
        assert out.num_batched_tokens == sum(e.num_new_tokens for e in out.scheduled)
        assert out.num_batched_tokens <= w.max_num_batched_tokens
        assert len(sched.running) <= w.max_num_seqs

        for e in out.scheduled:
            seq = e.seq
            assert seq.status is SequenceStatus.RUNNING and any(s is seq for s in sched.running)
            end = seq.num_computed_tokens + e.num_new_tokens
            assert end <= seq.num_tokens
            assert e.samples == (end == seq.num_tokens)
            # Room for exactly the tokens computed once this step is done; a static member
            # reserves room for all its known tokens when it joins the batch.
            if w.scheduling == "static":
                reserved = ceil_div(seq.num_tokens, self.bs)
                assert ceil_div(end, self.bs) <= len(seq.block_table) <= reserved, seq
            else:
                assert len(seq.block_table) == ceil_div(end, self.bs), seq

        # Preempted: were running, now waiting with nothing computed and no blocks.
        before_running = {s.request_id for s in before.running}
        preempted = {s.request_id for s in out.preempted}
        assert len(preempted) == len(out.preempted)
        assert preempted <= before_running and not preempted & set(ids)
        for seq in out.preempted:
            assert seq.status is SequenceStatus.WAITING and seq.block_table == []
            assert seq.num_computed_tokens == 0 and any(s is seq for s in sched.waiting)
        self.num_preempted += len(out.preempted)
        self.num_steps_with_preemption += bool(out.preempted)
        assert sched.num_preemptions == self.num_preempted

        # Admission: the head of the waiting queue, in order, nobody overtaking it; never after a
        # preemption; under "static" only into an empty batch (re-admission included).
        admitted = [s.request_id for s in out.admitted]
        if out.preempted or (w.scheduling == "static" and before.running):
            assert not admitted, f"admitted {admitted} ({w.scheduling}, preempted {preempted})"
        assert admitted == [s.request_id for s in before.waiting[: len(admitted)]]
        for seq in out.admitted:
            assert seq.status is SequenceStatus.RUNNING
            if seq.request_id not in ids:
                # Only a static batch admits past the budget: members join with 0 tokens now,
                # holding their prefix-cache hits plus blocks reserved for the rest of the prompt,
                # and prefill in the next steps.
                assert w.scheduling == "static"
                assert out.num_batched_tokens == w.max_num_batched_tokens
                assert len(seq.block_table) == ceil_div(seq.num_tokens, self.bs)
        assert set(ids) <= before_running | set(admitted)
        kept = [s.request_id for s in before.running if s.request_id not in preempted]
        assert [s.request_id for s in sched.running] == kept + admitted

        # Decodes go first, and none is left out while a prefill chunk runs (bar preemption).
        is_decode = [i in before.decodes for i in ids]
        assert is_decode == sorted(is_decode, reverse=True), f"a prefill before a decode: {ids}"
        if not all(is_decode):
            starved = before.decodes - set(ids) - preempted
            assert not starved, f"decodes {starved} starved by prefill chunks in {ids}"

        # Liveness: a step with work to do schedules something; an idle engine admits.
        if before.running or before.waiting:
            assert out.scheduled, f"nothing scheduled with {before.running} {before.waiting}"
        if before.waiting and not before.running:
            assert out.admitted

    def check_victims(self, before: Before, out: SchedulerOutput) -> None:
        """Replay the running loop (decodes, then the rest, each in running order): a sequence
        short of blocks preempts the lowest-priority, latest-arrived running sequence not yet
        scheduled this step, itself included, until it fits or it is the victim."""
        key = self.scheduler._queue_key
        scheduled = {e.seq.request_id for e in out.scheduled}
        order = ([s for s in before.running if s.request_id in before.decodes]
                 + [s for s in before.running if s.request_id not in before.decodes])
        candidates = list(before.running)
        victims = list(out.preempted)
        for seq in order:
            if seq not in candidates:
                continue  # preempted while an earlier sequence asked for blocks
            while victims and victims[0] is max(candidates, key=key):
                candidates.remove(victim := victims.pop(0))
                if victim is seq:
                    break
            if seq.request_id in scheduled:
                candidates.remove(seq)
        assert not victims, f"victims {[v.request_id for v in out.preempted]} out of order"

    def run_fake_model(self, out: SchedulerOutput) -> None:
        """Write each chunk's contexts into the shadow KV cache, then read back every position
        the chunk attends to: each must hold this sequence's own context."""
        for e in out.scheduled:
            seq = e.seq
            for p in range(seq.num_computed_tokens, seq.num_computed_tokens + e.num_new_tokens):
                block_id = seq.block_table[p // self.bs]
                assert self.bm.blocks[block_id].ref_count == 1, (
                    f"{seq.request_id} writes position {p} into shared block {block_id}")
                slots = self.kv.setdefault(block_id, [None] * self.bs)
                slots[p % self.bs] = tuple(seq.token_ids[: p + 1])
        for e in out.scheduled:
            self.check_kv(e.seq, e.seq.num_computed_tokens + e.num_new_tokens)

    def check_kv(self, seq: Sequence, num_tokens: int) -> None:
        """The shadow KV behind the first `num_tokens` positions of `seq` is `seq`'s own."""
        for p in range(num_tokens):
            block_id = seq.block_table[p // self.bs]
            slot = self.kv.get(block_id, [None] * self.bs)[p % self.bs]
            context = tuple(seq.token_ids[: p + 1])
            assert slot == context, f"{seq.request_id} @{p}: block {block_id}: {slot} != {context}"

    def check_state(self, expected: dict[str, tuple[list[int], FinishReason]]) -> None:
        """Invariants between steps."""
        sched, bm, bs = self.scheduler, self.bm, self.bs
        live = sched.running + sched.waiting
        assert sorted(s.request_id for s in live) == sorted(sched.requests)
        assert len(sched.running) <= self.w.max_num_seqs
        for seq in sched.running:
            assert seq.status is SequenceStatus.RUNNING
            assert seq.num_uncomputed_tokens >= 1
            assert ceil_div(seq.num_computed_tokens, bs) <= len(seq.block_table)
            assert len(seq.block_table) <= ceil_div(seq.num_tokens, bs), seq
            self.check_kv(seq, seq.num_computed_tokens)
        for seq in sched.waiting:
            assert seq.status is SequenceStatus.WAITING
            assert seq.block_table == [] and seq.num_computed_tokens == 0
        keys = [sched._queue_key(s) for s in sched.waiting]
        assert keys == sorted(keys)

        # Blocks: the padding block is never handed out; a block held by two tables is a full,
        # cached block; used + free covers every usable block exactly once.
        uses = Counter(b for s in live for b in s.block_table)
        assert PAD_BLOCK_ID not in uses
        for block_id, n in uses.items():
            if n > 1:
                assert bm.enable_prefix_caching and bm.blocks[block_id].block_hash is not None
        assert bm.num_free_blocks + len(uses) == self.w.num_kv_blocks - 1
        # Every hashed block (registered in the prefix cache or not, used or free) holds exactly
        # the tokens its key names, computed after a parent block (or none, for a first block).
        for block in bm.blocks:
            if block.block_hash is None:
                continue
            parent_hash, tokens = block.prefix_key
            assert block.block_hash == hash(block.prefix_key)
            contexts = self.kv.get(block.block_id, [None])
            assert None not in contexts, f"hashed block {block.block_id} was never fully written"
            assert [c[-1] for c in contexts] == list(tokens), f"block {block.block_id}: stale hash"
            assert (parent_hash is None) == (len(contexts[0]) == 1), block.block_id

        for seq in live:  # outputs so far are a proper prefix of the full expected output
            tokens, _ = expected[seq.request_id]
            assert seq.output_token_ids == tokens[: seq.num_output_tokens]
            assert seq.num_output_tokens < len(tokens)


# -- the driver loop ----------------------------------------------------------------------------

def run_workload(w: Workload) -> Checker:
    scheduler = make_scheduler(
        num_kv_blocks=w.num_kv_blocks, block_size=w.block_size, max_model_len=w.max_model_len,
        max_num_seqs=w.max_num_seqs, max_num_batched_tokens=w.max_num_batched_tokens,
        policy=w.policy, scheduling=w.scheduling, enable_prefix_caching=w.enable_prefix_caching)
    assert (w.num_kv_blocks - 1) * w.block_size >= w.max_model_len  # what the engine guarantees
    d = Driver(scheduler)
    checker = Checker(w, scheduler)
    checker.hook()
    by_id = {request_id(i): req for i, req in enumerate(w.requests)}
    expected = {rid: expected_outputs(req, w.max_model_len) for rid, req in by_id.items()}
    seqs: dict[str, Sequence] = {}
    aborted: list[Sequence] = []

    total_work = sum(r.num_prompt_tokens + r.max_tokens for r in w.requests)
    last_event = max(max(r.arrival_step, r.abort_step or 0) for r in w.requests)
    max_steps = last_event + 1 + 4 * total_work  # generous (30k examples needed < 1x): no livelock
    step = 0
    while step <= last_event or scheduler.has_unfinished():
        for i, req in enumerate(w.requests):
            if req.arrival_step == step:
                rid = request_id(i)
                seqs[rid] = Sequence(
                    rid, prompt_tokens(i, req),
                    SamplingParams(max_tokens=req.max_tokens, ignore_eos=req.ignore_eos),
                    next(d.arrivals), req.priority)
                scheduler.add(seqs[rid])
        for i, req in enumerate(w.requests):
            rid = request_id(i)
            if req.abort_step == step:
                was_live = rid in scheduler.requests
                seq = scheduler.abort(rid)
                assert (seq is not None) == was_live
                if seq is not None:
                    assert seq is seqs[rid] and seq.status is SequenceStatus.FINISHED
                    assert seq.finish_reason is FinishReason.ABORTED
                    assert seq.block_table == [] and rid not in scheduler.requests
                    assert all(s is not seq for s in scheduler.running + scheduler.waiting)
                    aborted.append(seq)
                scheduler.block_manager.check_integrity(d.live())
        num_finished = len(d.finished)
        d.step(lambda seq: fake_token(by_id[seq.request_id], seq))
        for seq in d.finished[num_finished:]:
            assert seq.status is SequenceStatus.FINISHED and seq.block_table == []
            assert seq.request_id not in scheduler.requests
        checker.check_state(expected)
        step += 1
        assert step <= max_steps, f"not drained after {step} steps: livelock?"

    # Drained, nothing leaked.
    bm = scheduler.block_manager
    assert bm.num_free_blocks == w.num_kv_blocks - 1
    assert not scheduler.waiting and not scheduler.running and not scheduler.requests
    bm.check_integrity([])

    # Every request finished exactly once, with exactly the tokens the fake model produced.
    done = [s.request_id for s in d.finished + aborted]
    assert sorted(done) == sorted(by_id), f"finished {sorted(done)}"
    for rid, seq in seqs.items():
        req, (tokens, reason) = by_id[rid], expected[rid]
        assert seq.status is SequenceStatus.FINISHED
        assert seq.prompt_token_ids == prompt_tokens(int(rid[1:]), req)
        if seq.finish_reason is FinishReason.ABORTED:
            assert any(s is seq for s in aborted)
            assert seq.output_token_ids == tokens[: seq.num_output_tokens]
            assert seq.num_output_tokens < len(tokens)
        else:
            assert (seq.finish_reason, seq.output_token_ids) == (reason, tokens), rid
            if reason is FinishReason.LENGTH and seq.num_output_tokens < req.max_tokens:
                assert seq.num_tokens == w.max_model_len
        assert 0 <= seq.num_cached_tokens <= seq.num_prompt_tokens - 1
        assert seq.num_cached_tokens % w.block_size == 0
        if not w.enable_prefix_caching:
            assert seq.num_cached_tokens == 0
    return checker


# -- hand-picked cases --------------------------------------------------------------------------

# Three identical requests in a cache that holds one max_model_len sequence: they preempt each
# other over and over (6 preemptions), and every recompute hits blocks another one computed.
PING_PONG = Workload(
    block_size=2, max_model_len=12, num_kv_blocks=7, max_num_seqs=3, max_num_batched_tokens=8,
    policy="fcfs", scheduling="continuous", enable_prefix_caching=True,
    requests=(Request(0, 0, 5, 5, 10), Request(0, 0, 5, 5, 10), Request(0, 0, 5, 5, 10)),
)

# A static batch of three requests whose prompts are all in the prefix cache fills the cache; the
# first decode that needs a block preempts the latest member, which (admitted past the budget) has
# only shared blocks, so that frees nothing, then the next one; the first victim, never having
# computed a token, is aborted while it waits.
STATIC_OVERADMIT = Workload(
    block_size=2, max_model_len=8, num_kv_blocks=5, max_num_seqs=4, max_num_batched_tokens=4,
    policy="fcfs", scheduling="static", enable_prefix_caching=True,
    requests=(Request(0, 0, 5, 5, 2), Request(1, 0, 5, 5, 3), Request(1, 0, 5, 5, 3),
              Request(1, 0, 5, 5, 3, abort_step=7)),
)

# Static batching, priorities, EOS sampled mid-batch (and one EOS ignored), an abort of a running
# request and a 1-token budget: every step is one token, and the batch must still drain.
STATIC_TRICKLE = Workload(
    block_size=3, max_model_len=10, num_kv_blocks=5, max_num_seqs=1, max_num_batched_tokens=1,
    policy="priority", scheduling="static", enable_prefix_caching=True,
    requests=(
        Request(0, 1, 7, 4, 6, priority=1, eos_at=2, ignore_eos=True),
        Request(0, 1, 7, 7, 6, priority=0, eos_at=1, ignore_eos=False),
        Request(2, 0, 4, 0, 3, priority=-1, abort_step=20),
        Request(3, 1, 9, 6, 5, priority=0),
    ),
)


@settings(max_examples=600, deadline=None)
@given(workloads())
@example(PING_PONG)
@example(STATIC_OVERADMIT)
@example(STATIC_TRICKLE)
def test_random_workloads_drain_with_exact_outputs_and_no_leaks(w: Workload) -> None:
    run_workload(w)


def test_hand_picked_cases_still_preempt_and_hit_the_cache():
    """Guard the @example cases: they must keep exercising what they were picked for."""
    for w in (PING_PONG, STATIC_OVERADMIT):
        checker = run_workload(w)
        assert checker.num_preempted >= (3 if w is PING_PONG else 1)
        assert checker.bm.prefix_cache_hits > 0
    run_workload(STATIC_TRICKLE)


@settings(max_examples=100, deadline=None)
@given(block_size=st.integers(2, 4), num_prompt_tokens=st.integers(1, 20),
       max_tokens=st.integers(1, 8), repeat_token=st.booleans(), extend=st.booleans())
def test_a_repeated_prompt_hits_the_cache_in_every_full_block_but_the_last_token(
        block_size: int, num_prompt_tokens: int, max_tokens: int, repeat_token: bool, extend: bool):
    """A runs alone and finishes; B's prompt is A's prompt (or all of A's tokens, a follow-up
    turn). Nothing else ran, so every full block of B's prompt except the one holding its last
    token must come from the cache, even in a cache that holds just one max_model_len sequence."""
    max_model_len = 32
    num_kv_blocks = ceil_div(max_model_len, block_size) + 1
    d = Driver(make_scheduler(num_kv_blocks, block_size, max_model_len))
    prompt = [7] * num_prompt_tokens if repeat_token else list(range(10, 10 + num_prompt_tokens))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    a = Sequence("a", prompt, params, next(d.arrivals))
    d.scheduler.add(a)
    while d.scheduler.has_unfinished():
        d.step()
    b_prompt = a.token_ids if extend else prompt
    b = Sequence("b", b_prompt, SamplingParams(max_tokens=2, ignore_eos=True), next(d.arrivals))
    d.scheduler.add(b)
    while d.scheduler.has_unfinished():
        d.step()
    assert b.num_cached_tokens == (len(b_prompt) - 1) // block_size * block_size
    assert b.output_token_ids == [1000 + len(b_prompt), 1001 + len(b_prompt)]
    assert d.scheduler.block_manager.num_free_blocks == num_kv_blocks - 1
