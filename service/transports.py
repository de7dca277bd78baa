"""How the service reaches the engine: the same `engine.protocol` messages over two transports.

    ProcessTransport    the engine in a spawned child process, two shared-memory queues (production)
    InProcessTransport  the same engine loop in a thread of this process, two in-memory queues
                        (tests, debugging)

Each exposes `requests` and `outputs` queues with MessageQueue's interface, `start()`,
`is_alive()`, `pid` and `stop(timeout)`.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading

from engine import protocol
from engine.config import EngineConfig
from engine.ipc import MessageQueue


class ProcessTransport:
    def __init__(self, config: EngineConfig) -> None:
        from engine.process import run_engine  # imports no torch at module level

        self.requests = MessageQueue()
        self.outputs = MessageQueue()
        context = multiprocessing.get_context("spawn")  # never fork a process running gRPC threads
        self.process = context.Process(target=run_engine, name="turnstile-engine", daemon=True,
                                       args=(config, self.requests, self.outputs, os.getpid()))

    def start(self) -> None:
        self.process.start()

    def is_alive(self) -> bool:
        return self.process.is_alive()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def stop(self, timeout: float) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class LocalQueue:
    """MessageQueue's interface over queue.Queue, for an engine in a thread of this process."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def put(self, msg: protocol.Message, timeout: float | None = None) -> None:
        self._queue.put(msg)

    def get(self, timeout: float | None = None) -> protocol.Message:
        return self._queue.get(block=timeout != 0, timeout=timeout)

    def get_many(self, timeout: float | None = None, max_messages: int = 1024) -> list[protocol.Message]:
        messages = [self.get(timeout)]
        while len(messages) < max_messages:
            try:
                messages.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return messages


class InProcessTransport:
    def __init__(self, config: EngineConfig) -> None:
        self.requests = LocalQueue()
        self.outputs = LocalQueue()
        self.thread = threading.Thread(target=self._run, args=(config,), name="turnstile-engine",
                                       daemon=True)
        self.pid = os.getpid()

    def _run(self, config: EngineConfig) -> None:
        from engine.process import EngineLoop

        try:
            loop = EngineLoop(config, self.requests, self.outputs, os.getppid())
        except Exception as exc:
            self.outputs.put(protocol.EngineError(f"{type(exc).__name__}: {exc}"))
            return
        loop.run()

    def start(self) -> None:
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float) -> None:
        self.thread.join(timeout)


TRANSPORTS = {"process": ProcessTransport, "inprocess": InProcessTransport}
