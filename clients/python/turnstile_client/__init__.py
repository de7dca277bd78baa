"""Python client for Turnstile's gRPC API (turnstile.v1.GenerationService).

    from turnstile_client import Client
    with Client("localhost:50051") as client:
        print(client.generate("Once upon a time", max_tokens=32, temperature=0).text)
"""
from turnstile_client.client import DEFAULT_ADDRESS, AsyncClient, Client
from turnstile_client.errors import (
    DeadlineExceededError, InvalidArgumentError, ResourceExhaustedError, TurnstileError,
    UnauthenticatedError, UnavailableError,
)
from turnstile_client.messages import (
    Chunk, Completion, ModelInfo, Prompt, TokenLogprob, Timings, Usage, build_request,
)

__all__ = [
    "DEFAULT_ADDRESS", "AsyncClient", "Client", "Chunk", "Completion", "ModelInfo", "Prompt",
    "TokenLogprob", "Timings", "Usage", "build_request", "TurnstileError", "InvalidArgumentError",
    "ResourceExhaustedError", "UnavailableError", "UnauthenticatedError", "DeadlineExceededError",
]
