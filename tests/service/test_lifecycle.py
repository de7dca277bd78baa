"""`python -m service` as a real subprocess: engine crash and restart, SIGTERM drain, parent death."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnstile_client import Client, UnavailableError

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


class ServiceProcess:
    def __init__(self, *args: str) -> None:
        self.port = _free_port()
        self.address = f"localhost:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service", "--host", "localhost", "--port", str(self.port),
             "--max-num-seqs", "4", "--max-num-batched-tokens", "128", "--max-model-len", "1024",
             "--kv-cache-memory", "64MiB", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()
        self.channel = grpc.insecure_channel(self.address)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def _collect(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line)

    def status(self) -> int | None:
        try:
            return self.health.Check(health_pb2.HealthCheckRequest(service="turnstile.v1.GenerationService"),
                                     timeout=2).status
        except grpc.RpcError:
            return None

    def wait_status(self, status: int, timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.status() == status:
                return time.monotonic() - start
            assert self.proc.poll() is None, "".join(self.log)
            time.sleep(0.05)
        raise AssertionError(f"health never became {status}; log:\n{''.join(self.log)}")

    def engine_pids(self) -> list[int]:
        return [int(m) for line in self.log for m in re.findall(r"engine ready: pid (\d+)", line)]

    def close(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def service():
    running = ServiceProcess()
    running.wait_status(SERVING, timeout=600)
    yield running
    running.close()


def test_engine_kill9_ends_streams_and_restarts(service):
    engine_pid = service.engine_pids()[-1]
    with Client(service.address, timeout=300) as client:
        stream = client.generate_stream("Write a long story.", max_tokens=500, ignore_eos=True)
        next(stream)
        killed = time.monotonic()
        os.kill(engine_pid, signal.SIGKILL)
        with pytest.raises(UnavailableError) as raised:
            for _ in stream:
                pass
        assert time.monotonic() - killed < 1.5  # noticed within a second (plus a poll)
        assert "engine" in raised.value.message
        assert service.status() == NOT_SERVING
        with pytest.raises(UnavailableError):
            client.generate("Hello", max_tokens=2)
        service.wait_status(SERVING, timeout=600)
        assert len(service.engine_pids()) == 2 and service.engine_pids()[-1] != engine_pid
        out = client.generate("Hello", max_tokens=3, temperature=0, ignore_eos=True)
        assert len(out.token_ids) == 3


def test_sigterm_drains_in_flight_then_exits_zero(service):
    engine_pid = service.engine_pids()[-1]
    with Client(service.address, timeout=300) as client:
        stream = client.generate_stream("Write a story.", max_tokens=24, ignore_eos=True)
        first = next(stream)
        service.proc.send_signal(signal.SIGTERM)
        service.wait_status(NOT_SERVING, timeout=5)
        with pytest.raises(UnavailableError) as raised:
            client.generate("Hello", max_tokens=2)
        assert "shutting down" in raised.value.message
        rest = list(stream)  # the in-flight request still finishes in full
    assert rest[-1].finish_reason == "length"
    assert len(first.token_ids) + sum(len(chunk.token_ids) for chunk in rest) == 24
    assert service.proc.wait(timeout=60) == 0
    assert not _pid_exists(engine_pid)


def test_sigterm_grace_period_aborts_the_rest():
    service = ServiceProcess("--shutdown-grace-s", "0.5")
    try:
        service.wait_status(SERVING, timeout=600)
        with Client(service.address, timeout=300) as client:
            stream = client.generate_stream("Write a long story.", max_tokens=500, ignore_eos=True)
            next(stream)
            service.proc.send_signal(signal.SIGTERM)
            rest = list(stream)
        assert rest[-1].finish_reason == "aborted"
        assert service.proc.wait(timeout=60) == 0
    finally:
        service.close()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().split(")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_idle_engine_sleeps_and_exits_when_service_is_killed(service):
    engine_pid = service.engine_pids()[-1]
    time.sleep(1.0)  # let the first idle wait begin
    before = _cpu_seconds(engine_pid)
    time.sleep(2.0)
    assert _cpu_seconds(engine_pid) - before < 0.1  # blocked on the queue, not spinning
    service.proc.kill()
    service.proc.wait()
    deadline = time.monotonic() + 5
    while _pid_exists(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_exists(engine_pid)


def test_engine_that_cannot_load_exits_nonzero_with_the_reason(tmp_path):
    missing = tmp_path / "missing.gguf"
    proc = subprocess.run([sys.executable, "-m", "service", "--port", "0", "--model", str(missing)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "the engine could not start" in proc.stderr and str(missing) in proc.stderr


def test_bad_flag_or_environment_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "service", "--max-num-seqs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "max_num_seqs must be a positive integer" in proc.stderr
    env = {**os.environ, "TURNSTILE_SCHEDULING": "greedy"}
    proc = subprocess.run([sys.executable, "-m", "service"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2 and "TURNSTILE_SCHEDULING='greedy'" in proc.stderr


def test_sigterm_while_loading_exits_zero():
    service = ServiceProcess()
    try:
        service.wait_status(NOT_SERVING, timeout=60)  # listening, model still loading
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(timeout=60) == 0
        assert "could not start" not in "".join(service.log)
    finally:
        service.close()
