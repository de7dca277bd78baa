"""EngineCore: the step loop that joins scheduler, model runner and sampler.

Used in-process by `engine.LLM` and the tests, and (later) inside the engine process behind the
shared-memory queue. Callers add requests, call `step()` until nothing is left, and receive only
deltas: the tokens each sequence gained in this step and, once, its finish reason.
"""

from __future__ import annotations

import itertools
import time

from engine.config import EngineConfig
from engine.model_runner import ModelRunner
from engine.protocol import SequenceDelta
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.weights import load_model_config, load_weights, resolve_model_path


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_path = resolve_model_path(config.model)
        self.model_config = load_model_config(self.model_path)
        tensors = load_weights(self.model_path, self.model_config)
        self.runner = ModelRunner(config, self.model_config, tensors, source=str(self.model_path))
        del tensors
        self.cache_config = self.runner.cache_config
        self.scheduler = Scheduler(config, self.cache_config, self.model_config.eos_token_ids)
        self._arrivals = itertools.count()
        self.num_steps = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0, arrival_time: float | None = None) -> None:
        """Queue a request. Raises ValueError naming the problem; nothing is queued then.

        `arrival_time` is a time.monotonic() reading (default: now); queue times count from it.
        """
        self.validate_request(request_id, prompt_token_ids, params, priority)
        if arrival_time is None:
            arrival_time = time.monotonic()
        seq = Sequence(request_id, prompt_token_ids, params, next(self._arrivals), priority,
                       arrival_time=arrival_time)
        self.scheduler.add(seq)

    def validate_request(self, request_id: str, prompt_token_ids: list[int],
                         params: SamplingParams, priority: int = 0) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already in the engine")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        if not prompt_token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        max_len = self.cache_config.max_model_len
        if len(prompt_token_ids) >= max_len:
            raise ValueError(f"prompt has {len(prompt_token_ids)} tokens but max_model_len is "
                             f"{max_len}: it must leave room for at least one new token")
        vocab = self.model_config.vocab_size
        for token_id in prompt_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab:
                raise ValueError(f"prompt token id {token_id!r} is out of the vocabulary [0, {vocab})")
        for token_id in params.stop_token_ids:
            if token_id >= vocab:
                raise ValueError(f"stop_token_ids: {token_id} is out of the vocabulary [0, {vocab})")

    def abort(self, request_id: str) -> bool:
        """Cancel a request; its blocks are free when this returns. False if it is unknown."""
        return self.scheduler.abort(request_id) is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[SequenceDelta]:
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        now = time.monotonic()
        for entry in out.scheduled:
            if entry.seq.first_scheduled_time is None:
                entry.seq.first_scheduled_time = now
        sampled = self.runner.execute(out)
        self.scheduler.update(out, sampled.token_ids)
        self.num_steps += 1
        outputs = []
        logprobs = iter(sampled.logprobs)
        for entry in out.scheduled:
            if not entry.samples:
                continue
            seq = entry.seq
            first = seq.num_output_tokens == 1
            outputs.append(SequenceDelta(
                request_id=seq.request_id,
                new_token_ids=[seq.token_ids[-1]],
                new_logprobs=[next(logprobs)],
                finish_reason=None if seq.finish_reason is None else seq.finish_reason.value,
                num_prompt_tokens=seq.num_prompt_tokens,
                num_cached_tokens=seq.num_cached_tokens,
                queue_time_s=seq.first_scheduled_time - seq.arrival_time if first else None,
            ))
        return outputs
