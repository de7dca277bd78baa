"""The gRPC server: GenerationService, grpc.health.v1, reflection, API key check, TLS, shutdown.

Life of a server:

    start: listen (health NOT_SERVING) ─► spawn engine ─► READY ─► load tokenizer ─► SERVING
    engine dies: NOT_SERVING, in-flight streams end UNAVAILABLE ─► restart ─► SERVING
    SIGTERM: NOT_SERVING, new requests UNAVAILABLE ─► in-flight finish (up to the grace period;
             the rest end with FINISH_REASON_ABORTED) ─► engine shut down ─► exit 0
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.config import ServiceConfig, parse_config
from service.engine_client import EngineClient, EngineStartError
from service.errors import Unauthenticated
from service.servicer import GenerationServicer
from service.tokenizer import ServiceTokenizer
from service.validation import Limits
from turnstile_client.pb import generate_pb2 as pb
from turnstile_client.pb import generate_pb2_grpc as pb_grpc

log = logging.getLogger("turnstile.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GenerationService"].full_name
HEALTH_PREFIX = "/grpc.health.v1.Health/"  # probes carry no credentials: always open


class Server:
    def __init__(self, config: ServiceConfig, transport: str = "process") -> None:
        self.config = config
        self.engine = EngineClient(config.engine, transport, config.max_engine_restarts,
                                   config.engine_start_timeout_s, self._on_engine_state)
        self.servicer = GenerationServicer(
            self.engine, Limits(config.max_tokens_cap, config.max_stop_strings), config.max_queue_size)
        self.health = health.aio.HealthServicer()
        self.port: int | None = None  # the bound port (config.port may be 0: any free port)
        self._grpc = grpc.aio.server(
            interceptors=[ApiKeyInterceptor(config.api_key)] if config.api_key else [])
        pb_grpc.add_GenerationServiceServicer_to_server(self.servicer, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc)
        reflection.enable_server_reflection(
            [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], self._grpc)
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Listen at once (health NOT_SERVING), then start the engine and wait for READY."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.config.tls_cert:
            credentials = grpc.ssl_server_credentials(
                [(Path(self.config.tls_key).read_bytes(), Path(self.config.tls_cert).read_bytes())])
            self.port = self._grpc.add_secure_port(self.config.address, credentials)
        else:
            self.port = self._grpc.add_insecure_port(self.config.address)
        await self._grpc.start()
        log.info("listening on %s:%d; loading the model", self.config.host, self.port)
        await self.engine.start()

    def _on_engine_state(self, serving: bool) -> None:
        if serving and self.servicer.tokenizer is None:
            self.servicer.tokenizer = ServiceTokenizer.from_dir(self.engine.info.tokenizer_dir)
        status = health_pb2.HealthCheckResponse
        asyncio.ensure_future(self._set_health(status.SERVING if serving else status.NOT_SERVING))

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def wait(self) -> int:
        """Until stop() finishes (0) or the engine is given up on (1). Returns the exit code."""
        stopped = asyncio.ensure_future(self._stopped.wait())
        done, _ = await asyncio.wait([stopped, self.engine.failed], return_when=asyncio.FIRST_COMPLETED)
        if self.engine.failed in done:
            log.error("%s", self.engine.failed.result())
            await self.stop(grace_s=0)
            return 1
        return 0

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new requests, let in-flight ones finish within the grace
        period, end the rest with FINISH_REASON_ABORTED, then stop the engine."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        log.info("draining: %d requests in flight, grace period %.1f s", self.engine.num_in_flight, grace_s)
        self.servicer.draining = True
        await self.health.enter_graceful_shutdown()
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.engine.num_in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self.engine.num_in_flight:
            log.warning("grace period over: aborting %d requests", self.engine.num_in_flight)
            self.engine.abort_all()
        await self._grpc.stop(grace=1.0)  # lets the aborted streams send their last message
        await self.engine.shutdown()
        log.info("stopped")
        self._stopped.set()


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <key>` on every call except health checks."""

    def __init__(self, api_key: str) -> None:
        self._expected = f"Bearer {api_key}".encode()

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode(), self._expected):
            return handler
        return _refusing(handler, Unauthenticated(
            "missing or wrong API key: send metadata 'authorization: Bearer <key>'"))


def _refusing(handler: grpc.RpcMethodHandler, error: Unauthenticated) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends every call with `error`."""
    async def refuse(request, context):
        await context.abort(error.code, str(error))

    async def refuse_stream(request, context):
        await context.abort(error.code, str(error))
        yield  # makes this an async generator, as a server-streaming handler must be

    kwargs = dict(request_deserializer=handler.request_deserializer,
                  response_serializer=handler.response_serializer)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **kwargs)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    return grpc.stream_stream_rpc_method_handler(refuse_stream, **kwargs)


async def serve(config: ServiceConfig) -> int:
    server = Server(config)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stopping or stopping.append(loop.create_task(server.stop())))
    try:
        await server.start()
    except EngineStartError as exc:
        if stopping:  # SIGTERM while the model was loading: a clean stop, not a failure
            await stopping[0]
            return 0
        log.error("the engine could not start: %s", exc)
        await server.stop(grace_s=0)
        return 1
    log.info("serving %s on port %d", server.engine.info.model_id, server.port)
    return await server.wait()


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(serve(config)))
