"""Requests built from keyword arguments, and results read back from the wire: the part of the
client that does not care whether the channel is sync or async."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

from turnstile_client.pb import generate_pb2 as pb

# str: text; a sequence of {"role", "content"} mappings: chat; any other sequence: token ids.
Prompt = Union[str, Sequence[int], Sequence[Mapping[str, str]]]


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class Timings:
    queue_time_s: float
    time_to_first_token_s: float


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob), most likely first


@dataclass
class Chunk:
    """One streamed message. finish_reason, usage and timings are set on the last one only."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # "length", "stop", "stop_string" or "aborted"
    usage: Usage | None = None
    timings: Timings | None = None


@dataclass
class Completion:
    """A whole generation: the chunks of one stream joined. None fields: the stream ended early."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    usage: Usage | None
    timings: Timings | None
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class ModelInfo:
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
    max_tokens_cap: int


def _set_prompt(message, prompt: Prompt) -> None:
    """Fill the `prompt` oneof of a GenerateRequest or TokenizeRequest."""
    if isinstance(prompt, str):
        message.text = prompt
    elif not isinstance(prompt, Sequence) or isinstance(prompt, (bytes, bytearray)):
        raise TypeError(f"prompt must be a str, token ids or chat messages, not {type(prompt).__name__}")
    elif prompt and all(isinstance(m, Mapping) for m in prompt):
        message.chat.messages.extend(pb.ChatMessage(role=m["role"], content=m["content"]) for m in prompt)
    elif "token_ids" in message.DESCRIPTOR.fields_by_name:
        message.token_ids.SetInParent()  # an empty list is still a (rejected) token_ids prompt
        message.token_ids.ids.extend(prompt)
    else:
        raise TypeError("this call takes text or chat messages, not token ids")


def build_request(
    prompt: Prompt,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float | None = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    seed: int | None = None,
    stop: str | Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    logprobs: int | None = None,
    priority: int = 0,
    request_id: str = "",
) -> pb.GenerateRequest:
    """A GenerateRequest. None leaves an optional field unset (the server's default applies)."""
    sampling = pb.SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty, seed=seed,
    )
    request = pb.GenerateRequest(
        request_id=request_id, sampling=sampling, max_tokens=max_tokens,
        stop=[stop] if isinstance(stop, str) else stop, stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos, logprobs=logprobs, priority=priority,
    )
    _set_prompt(request, prompt)
    return request


def build_tokenize_request(prompt: Prompt) -> pb.TokenizeRequest:
    request = pb.TokenizeRequest()
    _set_prompt(request, prompt)
    return request


_FINISH_REASONS = {
    v.number: v.name.removeprefix("FINISH_REASON_").lower() for v in pb.FinishReason.DESCRIPTOR.values
}


def chunk_from_proto(response: pb.GenerateResponse) -> Chunk:
    last = response.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    return Chunk(
        request_id=response.request_id,
        text=response.text,
        token_ids=list(response.token_ids),
        logprobs=[
            TokenLogprob(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top])
            for lp in response.logprobs
        ],
        finish_reason=_FINISH_REASONS.get(response.finish_reason, str(response.finish_reason)) if last else None,
        usage=Usage(response.usage.prompt_tokens, response.usage.completion_tokens,
                    response.usage.cached_tokens) if response.HasField("usage") else None,
        timings=Timings(response.timings.queue_time_s, response.timings.time_to_first_token_s)
        if response.HasField("timings") else None,
    )


def fold(chunks: Iterable[Chunk]) -> Completion:
    """Join a stream's chunks into one Completion."""
    chunks = list(chunks)
    last = chunks[-1] if chunks else Chunk("", "", [])
    return Completion(
        request_id=last.request_id,
        text="".join(c.text for c in chunks),
        token_ids=[t for c in chunks for t in c.token_ids],
        finish_reason=last.finish_reason,
        usage=last.usage,
        timings=last.timings,
        logprobs=[lp for c in chunks for lp in c.logprobs],
    )


def model_info_from_proto(response: pb.GetModelInfoResponse) -> ModelInfo:
    values = {f.name: getattr(response, f.name) for f in dataclasses.fields(ModelInfo)}
    return ModelInfo(**{**values, "eos_token_ids": list(response.eos_token_ids)})
