"""Turns a GenerateRequest into what the engine takes, or raises InvalidArgument naming the field.

Everything a client can get wrong is checked here, before anything reaches the engine; the engine
checks again as a backstop (a `RequestRejected` reply).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.protocol import Ready
from engine.sampling_params import SamplingParams
from service.errors import InvalidArgument
from service.tokenizer import ServiceTokenizer
from turnstile_client.pb import generate_pb2 as pb

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class Limits:
    max_tokens_cap: int  # largest max_tokens a request may ask for
    max_stop_strings: int
    max_stop_string_chars: int = 1024


@dataclass(frozen=True)
class ValidRequest:
    prompt_token_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]  # stop strings, matched on text by the service
    priority: int


def prompt_token_ids(request: pb.GenerateRequest | pb.TokenizeRequest,
                     tokenizer: ServiceTokenizer) -> list[int]:
    """The prompt as token ids: text and chat are tokenized, token ids pass through."""
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidArgument("prompt: set one of text, token_ids or chat")
    if kind == "text":
        if not request.text:
            raise InvalidArgument("text: the prompt is empty")
        return tokenizer.encode(request.text)
    if kind == "token_ids":
        if not request.token_ids.ids:
            raise InvalidArgument("token_ids.ids: the prompt is empty")
        return list(request.token_ids.ids)
    messages = [{"role": m.role, "content": m.content} for m in request.chat.messages]
    if not messages:
        raise InvalidArgument("chat.messages: at least one message is needed")
    try:
        text = tokenizer.apply_chat_template(messages)
    except ValueError as exc:
        raise InvalidArgument(f"chat.messages: {exc}") from exc
    # The template already wrote any BOS token; adding special tokens again would double it.
    return tokenizer.encode(text, add_special_tokens=False)


def validate(request: pb.GenerateRequest, tokenizer: ServiceTokenizer, model: Ready,
             limits: Limits) -> ValidRequest:
    token_ids = prompt_token_ids(request, tokenizer)
    for index, token_id in enumerate(token_ids):
        if token_id >= model.vocab_size:
            raise InvalidArgument(f"token_ids.ids[{index}] = {token_id} is outside the vocabulary "
                                  f"[0, {model.vocab_size})")
    room = model.max_model_len - len(token_ids)
    if room < 1:
        raise InvalidArgument(f"prompt: {len(token_ids)} tokens do not fit max_model_len "
                              f"{model.max_model_len} with room for one new token")

    if request.HasField("max_tokens"):
        if not 1 <= request.max_tokens <= limits.max_tokens_cap:
            raise InvalidArgument(f"max_tokens must be in [1, {limits.max_tokens_cap}], "
                                  f"got {request.max_tokens}")
        max_tokens = request.max_tokens
    else:
        max_tokens = min(limits.max_tokens_cap, room)

    if len(request.stop) > limits.max_stop_strings:
        raise InvalidArgument(f"stop: at most {limits.max_stop_strings} stop strings, "
                              f"got {len(request.stop)}")
    for index, stop in enumerate(request.stop):
        if not stop or len(stop) > limits.max_stop_string_chars:
            raise InvalidArgument(f"stop[{index}] must have 1 to {limits.max_stop_string_chars} "
                                  f"characters, got {len(stop)}")
    for index, token_id in enumerate(request.stop_token_ids):
        if token_id >= model.vocab_size:
            raise InvalidArgument(f"stop_token_ids[{index}] = {token_id} is outside the vocabulary "
                                  f"[0, {model.vocab_size})")
    if request.HasField("logprobs") and request.logprobs > MAX_LOGPROBS:
        raise InvalidArgument(f"logprobs must be in [0, {MAX_LOGPROBS}], got {request.logprobs}")

    return ValidRequest(token_ids, _sampling_params(request, max_tokens), tuple(request.stop),
                        request.priority)


def _sampling_params(request: pb.GenerateRequest, max_tokens: int) -> SamplingParams:
    s = request.sampling
    values = dict(
        temperature=s.temperature if s.HasField("temperature") else 1.0,
        top_p=s.top_p if s.HasField("top_p") else 1.0,
        top_k=s.top_k,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty if s.HasField("repetition_penalty") else 1.0,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
    )
    for name, value in values.items():  # floats arrive as float32: show the number the user sent
        if isinstance(value, float) and not math.isnan(value):
            values[name] = float(f"{value:.7g}")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            seed=s.seed if s.HasField("seed") else None,
            stop_token_ids=tuple(request.stop_token_ids),
            ignore_eos=request.ignore_eos,
            logprobs=request.logprobs if request.HasField("logprobs") else None,
            **values,
        )
    except ValueError as exc:  # SamplingParams names the field; give its path in the request
        field = str(exc).split(" ", 1)[0]
        prefix = "sampling." if field in values or field == "seed" else ""
        raise InvalidArgument(f"{prefix}{exc}") from exc
