"""A scheduler driven by a fake model: no tensors, so every step runs in microseconds.

The fake "model" samples token `1000 + position` for each sequence, so outputs are predictable and
never hit EOS (token 2) unless a test asks for it.
"""

from __future__ import annotations

import itertools

from engine.config import CacheConfig, EngineConfig
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence

EOS = 2


def make_scheduler(num_kv_blocks: int = 64, block_size: int = 4, max_model_len: int = 256,
                   **config) -> Scheduler:
    engine_config = EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks, **config)
    cache = CacheConfig(block_size, num_kv_blocks, max_model_len)
    return Scheduler(engine_config, cache, eos_token_ids=(EOS,))


class Driver:
    """Adds requests and runs steps against a Scheduler, recording each step's schedule."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.arrivals = itertools.count()
        self.finished: list[Sequence] = []

    def add(self, request_id: str, num_prompt_tokens: int = 4, max_tokens: int = 4,
            priority: int = 0, first_token: int = 10, **params) -> Sequence:
        prompt = list(range(first_token, first_token + num_prompt_tokens))
        seq = Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params),
                       next(self.arrivals), priority)
        self.scheduler.add(seq)
        return seq

    def step(self, sample=lambda seq: 1000 + seq.num_tokens) -> SchedulerOutput:
        out = self.scheduler.schedule()
        sampled = [sample(e.seq) for e in out.scheduled if e.samples]
        self.finished += self.scheduler.update(out, sampled)
        self.scheduler.block_manager.check_integrity(self.live())
        return out

    def live(self) -> list[Sequence]:
        return self.scheduler.running + self.scheduler.waiting


def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
    """A step's schedule as [(request_id, num_new_tokens)], in scheduling order."""
    return [(e.seq.request_id, e.num_new_tokens) for e in out.scheduled]
