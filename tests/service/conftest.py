"""Real servers on loopback: the gRPC front end runs on an event loop in a background thread of the
test process; its engine is a real child process joined by the shared-memory queues.

Tests talk to it with ordinary clients over TCP and read `server.engine.stats` (the engine's own
gauges, delivered over the queue) to check what happened inside the engine.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from engine.config import EngineConfig
from engine.weights import DEFAULT_MODEL
from service.config import ServiceConfig
from service.server import Server

MAX_MODEL_LEN = 1024
MAX_TOKENS_CAP = 512


class ServerThread:
    """A `service.server.Server` on its own event loop thread."""

    def __init__(self, config: ServiceConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: Server = self.call(_make_server, config)
        self.call(self.server.start, timeout=600)
        self.address = f"localhost:{self.server.port}"

    def call(self, fn: Callable, *args, timeout: float = 60):
        """Run `fn(*args)` (a coroutine function or a plain one) on the server's loop."""
        async def run():
            result = fn(*args)
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    @property
    def engine(self):
        return self.server.engine

    def wait_for_stats(self, predicate: Callable, timeout: float = 10.0):
        """The first EngineStats (newer than any seen before) that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.engine.stats
            if stats is not None and predicate(stats):
                return stats
            time.sleep(0.005)
        raise AssertionError(f"no EngineStats matched within {timeout} s; last: {self.engine.stats}")

    def stop(self) -> None:
        self.call(self.server.stop, 0, timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _make_server(config: ServiceConfig) -> Server:
    return Server(config)  # built on the loop's thread: grpc.aio binds to the running loop


def engine_config(**overrides) -> EngineConfig:
    values = dict(model=DEFAULT_MODEL, device="cpu", dtype="float32", max_num_seqs=16,
                  max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN,
                  kv_cache_memory_bytes=128 << 20, num_threads=2)
    values.update(overrides)
    return EngineConfig(**values)


@pytest.fixture(scope="session")
def server():
    """The shared server: 16 sequences per step, max_model_len 1024, max_tokens cap 512."""
    config = ServiceConfig(engine=engine_config(), host="localhost", port=0,
                           max_tokens_cap=MAX_TOKENS_CAP, max_stop_strings=4)
    running = ServerThread(config)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for localhost: (cert.pem, key.pem)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture(scope="session")
def strict_server(tls_files):
    """TLS, an API key, one running sequence and a waiting queue of one."""
    cert, key = tls_files
    config = ServiceConfig(engine=engine_config(max_num_seqs=1, max_num_batched_tokens=64),
                           host="localhost", port=0, max_queue_size=1, api_key="s3cret",
                           tls_cert=cert, tls_key=key)
    running = ServerThread(config)
    yield running
    running.stop()
