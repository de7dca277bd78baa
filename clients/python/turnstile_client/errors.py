"""Typed exceptions for failed calls, mapped from gRPC status codes in one place."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc


class TurnstileError(Exception):
    """A failed call. `code` is the gRPC status name ("INVALID_ARGUMENT"), `message` its details."""

    def __init__(self, code: str, message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgumentError(TurnstileError):
    """A request field is out of range; the message names the field."""


class ResourceExhaustedError(TurnstileError):
    """The server's waiting queue is full; retry later."""


class UnavailableError(TurnstileError):
    """The server cannot be reached, its engine is down or restarting, or it is draining."""


class UnauthenticatedError(TurnstileError):
    """The API key is missing or wrong."""


class DeadlineExceededError(TurnstileError):
    """The call's deadline (timeout) passed; the server aborted the request."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def error_from_rpc(error: grpc.RpcError) -> TurnstileError:
    """The typed exception for a sync `grpc.RpcError` or a `grpc.aio.AioRpcError` (a subclass)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or str(error)
    return _BY_CODE.get(code, TurnstileError)(code.name, message)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise any gRPC error inside the block as its TurnstileError (works around awaits too)."""
    try:
        yield
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
