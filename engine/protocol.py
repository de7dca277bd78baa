"""Messages between the service and the engine process: small typed structs, msgpack on the wire.

Imports neither torch nor grpc, so both sides (and the tests) can use it. Each message is encoded
as one msgpack array, a type tag followed by the fields in declaration order:

    AddRequest("r1", [1, 2, 3], params, 0, 12.5)  ->  [1, "r1", [1, 2, 3], {...params}, 0, 12.5]

Only deltas cross: a `StepOutputs` carries the tokens each sequence gained in one step, never the
whole sequence.

    service ──requests──► engine:  AddRequest, Abort, Shutdown
    service ◄──outputs─── engine:  Ready (once, after model load), StepOutputs (one per step),
                                   EngineStats (periodic), RequestRejected, EngineError
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import msgpack

from engine.sampling_params import SamplingParams


class Message:
    """Base of every wire struct; subclasses set a unique `tag`."""

    tag: ClassVar[int]

    def to_wire(self) -> list:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @classmethod
    def from_wire(cls, items: list):
        return cls(*items)


# ---- service -> engine ---------------------------------------------------------------------------

@dataclass(frozen=True)
class AddRequest(Message):
    tag = 1
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_time: float = 0.0  # time.monotonic() at the service (one clock for both processes)

    def to_wire(self) -> list:
        return [self.request_id, self.prompt_token_ids, dataclasses.asdict(self.params),
                self.priority, self.arrival_time]

    @classmethod
    def from_wire(cls, items: list) -> AddRequest:
        request_id, prompt_token_ids, params, priority, arrival_time = items
        return cls(request_id, prompt_token_ids, SamplingParams(**params), priority, arrival_time)


@dataclass(frozen=True)
class Abort(Message):
    tag = 2
    request_ids: list[str]


@dataclass(frozen=True)
class Shutdown(Message):
    tag = 3


# ---- engine -> service ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready(Message):
    """Sent once the model is loaded and the KV cache allocated: what the service must know."""

    tag = 10
    model_id: str
    architecture: str
    vocab_size: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    scheduling: str
    device: str
    dtype: str
    eos_token_ids: list[int]
    tokenizer_dir: str  # a Hugging Face tokenizer directory the service loads without torch
    pid: int


@dataclass(frozen=True)
class TokenLogprobs(Message):
    tag = 11
    token_id: int  # the chosen token
    logprob: float  # its logprob
    top: tuple[tuple[int, float], ...]  # top-n (token_id, logprob), descending; empty when n == 0

    @classmethod
    def from_wire(cls, items: list) -> TokenLogprobs:
        token_id, logprob, top = items
        return cls(token_id, logprob, tuple((t, lp) for t, lp in top))


@dataclass
class SequenceDelta(Message):
    """What one request gained in one step."""

    tag = 12
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finish_reason: str | None = None  # "length", "stop" or "aborted" (engine.sequence.FinishReason)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    queue_time_s: float | None = None  # arrival to first scheduled step; set on the first delta

    def to_wire(self) -> list:
        logprobs = [None if lp is None else lp.to_wire() for lp in self.new_logprobs]
        return [self.request_id, self.new_token_ids, logprobs, self.finish_reason,
                self.num_prompt_tokens, self.num_cached_tokens, self.queue_time_s]

    @classmethod
    def from_wire(cls, items: list) -> SequenceDelta:
        items[2] = [None if lp is None else TokenLogprobs.from_wire(lp) for lp in items[2]]
        return cls(*items)


@dataclass(frozen=True)
class StepOutputs(Message):
    tag = 13
    step: int  # the engine's step counter after this step
    outputs: list[SequenceDelta]

    def to_wire(self) -> list:
        return [self.step, [delta.to_wire() for delta in self.outputs]]

    @classmethod
    def from_wire(cls, items: list) -> StepOutputs:
        step, outputs = items
        return cls(step, [SequenceDelta.from_wire(delta) for delta in outputs])


@dataclass(frozen=True)
class EngineStats(Message):
    """The engine's gauges and counters; sent every few steps, after aborts and when idle."""

    tag = 14
    num_steps: int
    num_running: int
    num_waiting: int
    num_used_blocks: int  # blocks held by live sequences (cached free blocks count as free)
    num_usable_blocks: int  # all blocks but the padding block
    num_preemptions: int
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # of those, tokens found in the cache

    @property
    def kv_cache_usage(self) -> float:
        return self.num_used_blocks / self.num_usable_blocks


@dataclass(frozen=True)
class RequestRejected(Message):
    """The engine refused an AddRequest (the service validates first; this is the backstop)."""

    tag = 15
    request_id: str
    message: str


@dataclass(frozen=True)
class EngineError(Message):
    """The engine cannot start (for example, the model file is unreadable); it exits after this."""

    tag = 16
    message: str


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.tag: cls
    for cls in (AddRequest, Abort, Shutdown, Ready, TokenLogprobs, SequenceDelta, StepOutputs,
                EngineStats, RequestRejected, EngineError)
}


def encode(msg: Message) -> bytes:
    return msgpack.packb([msg.tag, *msg.to_wire()])


def decode(data: bytes) -> Message:
    tag, *items = msgpack.unpackb(data)
    cls = MESSAGE_TYPES.get(tag)
    if cls is None:
        raise ValueError(f"unknown message tag {tag!r}")
    return cls.from_wire(items)
