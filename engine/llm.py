"""Offline API: run the engine in-process over a list of prompts.

    from engine import LLM, SamplingParams
    llm = LLM(model="default", device="cpu", dtype="float32")
    outputs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.0))
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.protocol import TokenLogprobs
from engine.sampling_params import SamplingParams
from engine.tokenizer import load_tokenizer

Prompt = str | list[int]


@dataclass
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "length", "stop" or "aborted"
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    num_cached_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


class LLM:
    def __init__(self, model: str = "default", device: str = "cpu", dtype: str = "float32",
                 **engine_kwargs) -> None:
        self.config = EngineConfig(model=model, device=device, dtype=dtype, **engine_kwargs)
        self.engine = EngineCore(self.config)
        self.tokenizer = load_tokenizer(self.engine.model_path)
        self._request_ids = itertools.count()

    def generate(
        self,
        prompts: Prompt | SequenceABC[Prompt],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
        priorities: SequenceABC[int] | None = None,
    ) -> list[CompletionOutput]:
        """Generate for every prompt (text or token ids); outputs come back in prompt order.

        All prompts are validated before any is queued, so a bad one leaves the engine untouched.
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        priorities = [0] * len(prompts) if priorities is None else list(priorities)
        if len(sampling_params) != len(prompts) or len(priorities) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(sampling_params)} sampling "
                             f"params and {len(priorities)} priorities")
        outputs: dict[str, CompletionOutput] = {}
        requests = []
        for prompt, params, priority in zip(prompts, sampling_params, priorities):
            token_ids = self._tokenize(prompt)
            request_id = str(next(self._request_ids))
            self.engine.validate_request(request_id, token_ids, params, priority)
            requests.append((request_id, token_ids, params, priority))
            outputs[request_id] = CompletionOutput(request_id, token_ids)
        for request in requests:
            self.engine.add_request(*request)
        try:
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    out = outputs[delta.request_id]
                    out.token_ids.extend(delta.new_token_ids)
                    out.logprobs.extend(delta.new_logprobs)
                    out.num_cached_tokens = delta.num_cached_tokens
                    if delta.finish_reason is not None:
                        out.finish_reason = delta.finish_reason
        except BaseException:  # e.g. KeyboardInterrupt: leave no request behind in the engine
            for request_id in outputs:
                self.engine.abort(request_id)
            raise
        for out in outputs.values():
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return list(outputs.values())

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, (list, tuple)):
            return list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Render chat messages with the model's chat template, ready for generation."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
