"""TLS, the API key and the waiting-queue limit, on a server with one running slot and one waiting."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnstile_client import Client, ResourceExhaustedError, UnauthenticatedError


@pytest.fixture(scope="module")
def root_cert(tls_files) -> bytes:
    return Path(tls_files[0]).read_bytes()


def test_right_key_over_tls_generates(strict_server, root_cert):
    with Client(strict_server.address, api_key="s3cret", tls=root_cert, timeout=120) as client:
        out = client.generate("Hello", max_tokens=3, temperature=0, ignore_eos=True)
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


@pytest.mark.parametrize("api_key", [None, "wrong", "s3cret "])
def test_missing_or_wrong_key_is_unauthenticated(strict_server, root_cert, api_key):
    with Client(strict_server.address, api_key=api_key, tls=root_cert, timeout=30) as client:
        with pytest.raises(UnauthenticatedError) as raised:
            client.generate("Hello", max_tokens=3)
        assert "authorization" in raised.value.message
        with pytest.raises(UnauthenticatedError):
            client.model_info()


def test_health_needs_no_key(strict_server, root_cert):
    credentials = grpc.ssl_channel_credentials(root_cert)
    with grpc.secure_channel(strict_server.address, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_is_refused_by_tls_server(strict_server):
    with Client(strict_server.address, api_key="s3cret", timeout=5) as client:
        with pytest.raises(Exception) as raised:
            client.model_info()
    assert getattr(raised.value, "code", None) == "UNAVAILABLE"


def test_queue_full_is_resource_exhausted(strict_server, root_cert):
    with Client(strict_server.address, api_key="s3cret", tls=root_cert, timeout=300) as client:
        running = client.generate_stream("Tell me a long story.", max_tokens=400, ignore_eos=True)
        next(running)  # holds the single running slot
        waiting = client.generate_stream("Tell me another story.", max_tokens=4, ignore_eos=True)
        waiting_result = []
        reader = threading.Thread(target=lambda: waiting_result.extend(waiting))  # fills the queue
        reader.start()
        strict_server.wait_for_stats(lambda s: s.num_running == 1 and s.num_waiting == 1)
        with pytest.raises(ResourceExhaustedError) as raised:
            client.generate("One too many", max_tokens=2)
        assert "queue is full" in raised.value.message
        running.close()  # frees the slot: the waiting request runs and completes
        reader.join(120)
    assert waiting_result[-1].finish_reason == "length"
    assert sum(len(chunk.token_ids) for chunk in waiting_result) == 4
    stats = strict_server.wait_for_stats(lambda s: s.num_running == 0 and s.num_waiting == 0)
    assert stats.num_used_blocks == 0
