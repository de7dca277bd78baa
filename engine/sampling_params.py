"""Per-request sampling and stopping parameters.

A plain frozen dataclass: no torch, no grpc, so the service and the wire protocol can carry it.
Defaults follow vLLM/OpenAI: temperature 1.0 samples; temperature 0.0 is greedy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0.0 = greedy (argmax)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # drop tokens with p < min_p * p_max, in [0, 1]
    repetition_penalty: float = 1.0  # HF/CTRL style over prompt and output tokens, > 0
    frequency_penalty: float = 0.0  # OpenAI style over output tokens, in [-2, 2]
    presence_penalty: float = 0.0  # OpenAI style over output tokens, in [-2, 2]
    seed: int | None = None  # same seed, same tokens, whatever else is in the batch
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token; 0 = the chosen token only

    def __post_init__(self) -> None:
        # Lists are accepted for convenience and frozen into tuples.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_float("temperature", self.temperature, low=0.0, high=100.0)
        _check_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        _check_int("top_k", self.top_k, low=0)
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        _check_float("repetition_penalty", self.repetition_penalty, low=0.0, high=100.0, low_open=True)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=2**63 - 1)
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, low=0)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0, high=20)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_float(
    name: str, value: object, low: float, high: float, low_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got NaN")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        left = "(" if low_open else "["
        raise ValueError(f"{name} must be in {left}{low}, {high}], got {value}")
