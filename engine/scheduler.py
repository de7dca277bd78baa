"""Iteration-level scheduler: decides, before every step, which sequences run and how many tokens each.

It moves sequences between `waiting` and `running` and asks the BlockManager for blocks; it never
touches tensors. Each step:

  1. running sequences, decodes first (1 token each), then unfinished prefills (next chunk), within
     the token budget `max_num_batched_tokens`; a sequence that cannot get a block preempts the
     lowest-priority, latest-arrived running sequence (recompute: its blocks are freed and it goes
     back to the waiting queue, ahead of newer requests);
  2. admission from the waiting queue while budget, `max_num_seqs` and free blocks allow. Under
     `static` scheduling (the seeds' baseline) admission happens only when nothing is running.

After the step, `update` advances `num_computed_tokens`, appends sampled tokens, and evicts finished
sequences at once, so their room is given to waiting requests on the very next step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import CacheConfig, EngineConfig
from engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int
    samples: bool  # this chunk reaches the last known token, so the step samples the next one


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig, cache: CacheConfig, eos_token_ids: tuple[int, ...]) -> None:
        self.config = config
        self.max_model_len = cache.max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = BlockManager(cache.num_kv_blocks, cache.block_size, config.enable_prefix_caching)
        self.waiting: list[Sequence] = []  # sorted by _queue_key
        self.running: list[Sequence] = []  # in admission order
        self.requests: dict[str, Sequence] = {}  # unfinished sequences by request_id
        self.num_preemptions = 0

    # -- queue ------------------------------------------------------------------------------

    def _queue_key(self, seq: Sequence) -> tuple[int, int]:
        priority = seq.priority if self.config.policy == "priority" else 0
        return (priority, seq.arrival_index)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request_id {seq.request_id!r} is already in the engine")
        self.requests[seq.request_id] = seq
        bisect.insort(self.waiting, seq, key=self._queue_key)

    def abort(self, request_id: str) -> Sequence | None:
        """Finish a waiting or running sequence now; its blocks are free when this returns."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self.block_manager.free(seq)
            self._retire(seq, FinishReason.ABORTED)
        else:
            self._finish(seq, FinishReason.ABORTED)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # -- one step ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        was_idle = not self.running
        scheduled_ids: set[str] = set()

        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.allocate(seq, num_new):
                victim = self._pick_victim(exclude=scheduled_ids)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self._schedule(out, seq, num_new)
            scheduled_ids.add(seq.request_id)
            budget -= num_new

        if out.preempted:
            return out  # memory is short: admitting now would only preempt again
        static = self.config.scheduling == "static"
        if static and not was_idle:
            return out  # the batch is closed until every member has finished
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            if budget == 0 and not static:
                break
            # A static batch is formed whole, even past this step's budget: members admitted
            # with 0 tokens now prefill as running sequences in the next steps.
            seq = self.waiting[0]
            hits = self.block_manager.find_cached_blocks(seq)
            num_hit_tokens = len(hits) * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_hit_tokens, budget)
            # A static member reserves its whole prompt now, so that the batch it joins cannot
            # run out of blocks before every member has prefilled.
            reserve = seq.num_tokens - num_hit_tokens if static else num_new
            if not self.block_manager.allocate(seq, reserve, hits):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.pop(0)
            if seq.num_preemptions == 0:
                self.block_manager.record_prefix_lookup(seq.num_prompt_tokens, num_hit_tokens)
                seq.num_cached_tokens = num_hit_tokens
            seq.num_computed_tokens = num_hit_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.admitted.append(seq)
            if num_new:
                self._schedule(out, seq, num_new)
                budget -= num_new
        return out

    def update(self, out: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        """Apply a step's results: `sampled_token_ids` has one token per scheduled entry that
        samples, in order. Returns the sequences that finished (already evicted, blocks freed)."""
        sampled = iter(sampled_token_ids)
        finished = []
        for entry in out.scheduled:
            seq = entry.seq
            seq.num_computed_tokens += entry.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
            if not entry.samples:
                continue
            token_id = next(sampled)
            seq.append_token(token_id)
            reason = self._stop_reason(seq, token_id)
            if reason is not None:
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    # -- helpers ----------------------------------------------------------------------------

    def _schedule(self, out: SchedulerOutput, seq: Sequence, num_new: int) -> None:
        samples = seq.num_computed_tokens + num_new == seq.num_tokens
        out.scheduled.append(ScheduledSequence(seq, num_new, samples))
        out.num_batched_tokens += num_new

    def _stop_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.params
        if not params.ignore_eos and token_id in self.eos_token_ids:
            return FinishReason.STOP
        if token_id in params.stop_token_ids:
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _pick_victim(self, exclude: set[str]) -> Sequence:
        """The lowest-priority, latest-arrived running sequence not yet scheduled this step.
        Never empty: the sequence asking for a block is itself a candidate. A victim whose
        blocks are all shared with others frees nothing and the caller takes the next one; this
        is rare, since a sequence's newest block is its own (the last prompt token is never a
        prefix-cache hit, and static members reserve their whole prompt on admission)."""
        candidates = [s for s in self.running if s.request_id not in exclude]
        return max(candidates, key=self._queue_key)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=self._queue_key)  # arrived earlier: lands at the front

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        self._retire(seq, reason)

    def _retire(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        del self.requests[seq.request_id]
