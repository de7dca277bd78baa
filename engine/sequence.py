r"""One request inside the engine: its tokens, its progress, its KV blocks.

One counter drives everything: `num_computed_tokens` is how many of `token_ids` have their K/V in
the cache. Prefill, a prefill chunk, a prefix-cache hit and a decode step all just advance it:

    token_ids:  [ p0 p1 p2 p3 p4 | o0 o1 o2 ]      num_prompt_tokens = 5, num_tokens = 8
                  \__ computed __/  \ to do /       num_computed_tokens = 5 -> 3 tokens left
"""

from __future__ import annotations

import enum
from typing import Any

from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # max_tokens or max_model_len reached
    STOP = "stop"  # EOS or a stop token id
    ABORTED = "aborted"  # cancelled by the caller


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_index: int,
        priority: int = 0,
        arrival_time: float = 0.0,
    ) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.block_table: list[int] = []  # written only by the BlockManager
        self.params = params
        self.priority = priority
        self.arrival_index = arrival_index  # global admission order; breaks every tie
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None  # set by EngineCore at the first step
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_preemptions = 0
        self.generator: Any = None  # the request's own torch.Generator when params.seed is set

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )
