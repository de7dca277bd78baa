"""Client (blocking, `grpc`) and AsyncClient (`grpc.aio`) for turnstile.v1.GenerationService.

Both build requests and read results with the same functions (messages.py) and map errors in one
place (errors.py); each method here only makes the call.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc
import grpc.aio

from turnstile_client.errors import UnavailableError, translate_errors
from turnstile_client.messages import (
    Chunk, Completion, ModelInfo, Prompt, build_request, build_tokenize_request, chunk_from_proto,
    fold, model_info_from_proto,
)
from turnstile_client.pb import generate_pb2 as pb
from turnstile_client.pb import generate_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = "localhost:50051"


class _Channel:
    """What both clients share: the channel, the stub and the per-call options."""

    _grpc: Any = grpc  # the module whose channels this client opens: grpc or grpc.aio

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        api_key: str | None = None,
        tls: bool | bytes = False,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ):
        """tls: False (plaintext), True (system root certificates) or PEM root certificates.
        timeout: default deadline of each call, in seconds (None: no deadline)."""
        if tls:
            credentials = grpc.ssl_channel_credentials(None if tls is True else tls)
            self._channel = self._grpc.secure_channel(address, credentials)
        else:
            self._channel = self._grpc.insecure_channel(address)
        self._stub = pb_grpc.GenerationServiceStub(self._channel)
        self._timeout = timeout
        auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._metadata = auth + tuple(metadata)

    def _options(self, timeout: float | None) -> dict[str, Any]:
        return {"timeout": self._timeout if timeout is None else timeout, "metadata": self._metadata}


class Client(_Channel):
    """Blocking client. Keyword arguments of generate* are those of `build_request`."""

    def generate(self, prompt: Prompt, *, timeout: float | None = None, **params: Any) -> Completion:
        return fold(self.generate_stream(prompt, timeout=timeout, **params))

    def generate_stream(self, prompt: Prompt, *, timeout: float | None = None, **params: Any) -> Iterator[Chunk]:
        """Chunks as the server sends them. The call starts on the first next(); closing the
        iterator (or leaving a `for` loop over it by an exception) cancels it."""
        return self._stream(build_request(prompt, **params), self._options(timeout))

    def _stream(self, request: pb.GenerateRequest, options: dict[str, Any]) -> Iterator[Chunk]:
        call = self._stub.Generate(request, **options)
        try:
            with translate_errors():
                for response in call:
                    yield chunk_from_proto(response)
        finally:
            call.cancel()  # no-op when the call has already finished

    def tokenize(self, prompt: Prompt, *, timeout: float | None = None) -> list[int]:
        with translate_errors():
            response = self._stub.Tokenize(build_tokenize_request(prompt), **self._options(timeout))
        return list(response.token_ids)

    def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        with translate_errors():
            response = self._stub.GetModelInfo(pb.GetModelInfoRequest(), **self._options(timeout))
        return model_info_from_proto(response)

    def wait_ready(self, timeout: float) -> None:
        """Block until the channel connects; UnavailableError after `timeout` seconds."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise UnavailableError("UNAVAILABLE", f"not connected after {timeout}s") from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Channel):
    """asyncio client (grpc.aio); create it inside the running event loop."""

    _grpc = grpc.aio

    async def generate(self, prompt: Prompt, *, timeout: float | None = None, **params: Any) -> Completion:
        return fold([chunk async for chunk in self.generate_stream(prompt, timeout=timeout, **params)])

    def generate_stream(self, prompt: Prompt, *, timeout: float | None = None, **params: Any) -> AsyncIterator[Chunk]:
        """Chunks as the server sends them (`async for`). The call starts on the first step;
        `aclose()` or cancelling the task that iterates cancels it."""
        return self._stream(build_request(prompt, **params), self._options(timeout))

    async def _stream(self, request: pb.GenerateRequest, options: dict[str, Any]) -> AsyncIterator[Chunk]:
        call = self._stub.Generate(request, **options)
        try:
            with translate_errors():
                async for response in call:
                    yield chunk_from_proto(response)
        finally:
            call.cancel()

    async def tokenize(self, prompt: Prompt, *, timeout: float | None = None) -> list[int]:
        with translate_errors():
            response = await self._stub.Tokenize(build_tokenize_request(prompt), **self._options(timeout))
        return list(response.token_ids)

    async def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        with translate_errors():
            response = await self._stub.GetModelInfo(pb.GetModelInfoRequest(), **self._options(timeout))
        return model_info_from_proto(response)

    async def wait_ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise UnavailableError("UNAVAILABLE", f"not connected after {timeout}s") from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
