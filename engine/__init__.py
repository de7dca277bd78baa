"""Turnstile engine: continuous batching over a paged KV cache.

`from engine import LLM, SamplingParams`. Attributes load lazily so that torch-free modules of this
package (protocol, sampling_params, config) can be imported by the service without pulling in torch.
"""

from engine.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "EngineConfig", "SamplingParams"]


def __getattr__(name: str):
    if name in ("LLM", "CompletionOutput"):
        from engine import llm

        return getattr(llm, name)
    if name == "EngineConfig":
        from engine.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
