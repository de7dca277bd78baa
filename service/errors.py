"""Every error a client can see, and its gRPC status: the one place where the mapping lives.

Code below raises these; the servicer turns them into a status with `abort_with`.
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    """A request field is out of range; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class AlreadyExists(ServiceError):
    """A request_id that is already in flight."""

    code = grpc.StatusCode.ALREADY_EXISTS


class QueueFull(ServiceError):
    """Every running slot and the whole waiting queue are taken."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    """The engine is starting, dead or restarting, or the server is draining."""

    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


async def abort_with(context: grpc.aio.ServicerContext, error: ServiceError) -> None:
    """End the call with `error`'s status and message (raises, as grpc.aio's abort does)."""
    await context.abort(error.code, str(error))
