"""The service's handle on the engine: submit requests, receive each request's deltas, watch health.

The service keeps only `request_id -> stream` (an asyncio.Queue of events); the engine owns the
sequences. Two transports carry the same `engine.protocol` messages:

    ProcessTransport    the engine in a child process, two shared-memory queues (production)
    InProcessTransport  the engine loop in a thread, two in-memory queues (tests, debugging)

A reader thread blocks on the output queue and hands each batch of messages to the event loop.
A watchdog checks the engine ten times a second; when it dies, every in-flight stream receives
`EngineDied`, `on_state_change(False)` fires, and the engine is restarted (up to `max_restarts`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable

from engine import protocol
from engine.config import EngineConfig
from engine.ipc import Empty, MessageQueue
from service.errors import AlreadyExists, Unavailable
from service.transports import TRANSPORTS

log = logging.getLogger("turnstile.engine_client")

WATCH_INTERVAL_S = 0.1
READ_TIMEOUT_S = 0.1
PUT_TIMEOUT_S = 1.0


class EngineDied:
    """Event for a stream whose request was lost with the engine."""


class ServerAborted:
    """Event for a stream the server ended early (the shutdown grace period ran out)."""


class EngineStartError(RuntimeError):
    pass


class EngineClient:
    def __init__(self, config: EngineConfig, transport: str = "process", max_restarts: int = 10,
                 start_timeout_s: float = 600.0,
                 on_state_change: Callable[[bool], None] = lambda serving: None) -> None:
        self.config = config
        self.transport_cls = TRANSPORTS[transport]
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.on_state_change = on_state_change
        self.info: protocol.Ready | None = None  # from the engine's READY handshake
        self.stats: protocol.EngineStats | None = None  # the latest EngineStats
        self.num_steps = 0  # the engine's step counter, from the latest StepOutputs
        self.serving = False
        self.num_restarts = 0
        self.failed: asyncio.Future[str] | None = None  # set when the engine is given up on
        self._streams: dict[str, asyncio.Queue] = {}
        self._transport = None
        self._ready: asyncio.Future | None = None
        self._stop_reader = threading.Event()
        self._reader: threading.Thread | None = None
        self._watchdog: asyncio.Task | None = None
        self._stopping = False

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine and wait for READY. Raises EngineStartError if it cannot load."""
        self.failed = asyncio.get_running_loop().create_future()
        await self._start_engine()
        self._watchdog = asyncio.create_task(self._watch())

    async def _start_engine(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._transport = self.transport_cls(self.config)
        self._transport.start()
        self._stop_reader = threading.Event()
        self._reader = threading.Thread(target=self._read, name="turnstile-engine-reader",
                                        args=(loop, self._transport.outputs, self._stop_reader),
                                        daemon=True)
        self._reader.start()
        started = time.monotonic()
        while not self._ready.done():
            if not self._transport.is_alive():
                await asyncio.sleep(READ_TIMEOUT_S * 2)  # let the reader deliver an EngineError
                if not self._ready.done():
                    self._ready.set_exception(EngineStartError("the engine process exited while loading"))
            elif time.monotonic() - started > self.start_timeout_s:
                self._transport.stop(0)
                self._ready.set_exception(EngineStartError(
                    f"the engine was not ready after {self.start_timeout_s:.0f} s"))
            else:
                await asyncio.wait([self._ready], timeout=WATCH_INTERVAL_S)
        self.info = self._ready.result()
        self.serving = True
        log.info("engine ready: pid %s, %s, %d KV blocks", self.info.pid, self.info.model_id,
                 self.info.num_kv_blocks)
        self.on_state_change(True)

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if self._stopping or self._transport.is_alive():
                continue
            self._lose_engine()
            while not self._stopping:
                if self.num_restarts >= self.max_restarts:
                    self.failed.set_result(f"the engine died and {self.max_restarts} restarts are used up")
                    return
                self.num_restarts += 1
                log.warning("engine died; restart %d of %d", self.num_restarts, self.max_restarts)
                try:
                    await self._start_engine()
                    break
                except EngineStartError as exc:
                    log.error("engine restart failed: %s", exc)

    def _lose_engine(self) -> None:
        self.serving = False
        self._stop_reader.set()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(EngineDied())
        self.on_state_change(False)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine to exit (killing it after `timeout`), then stop the threads."""
        self._stopping = True
        self.serving = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._transport is not None:
            try:
                self._transport.requests.put(protocol.Shutdown(), timeout=PUT_TIMEOUT_S)
            except Exception:  # a dead engine or a full queue: the join below kills it
                pass
            await asyncio.to_thread(self._transport.stop, timeout)
        self._stop_reader.set()
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join)

    # -- requests ---------------------------------------------------------------------------------

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def pid(self) -> int | None:
        return None if self._transport is None else self._transport.pid

    def add_request(self, request: protocol.AddRequest) -> asyncio.Queue:
        """Send `request`; its events (SequenceDelta, RequestRejected, EngineDied) arrive on the
        returned queue. The stream closes itself when a delta carries a finish reason."""
        if not self.serving:
            raise Unavailable("the engine is not ready (starting or restarting); retry shortly")
        if request.request_id in self._streams:
            raise AlreadyExists(f"request_id {request.request_id!r} is already in flight")
        stream: asyncio.Queue = asyncio.Queue()
        self._send(request)
        self._streams[request.request_id] = stream
        return stream

    def abort(self, request_id: str) -> None:
        """Forget the request here and free it in the engine (a no-op if it already finished)."""
        if self._streams.pop(request_id, None) is not None and self.serving:
            self._send(protocol.Abort([request_id]))

    def abort_all(self) -> None:
        """End every in-flight request with `ServerAborted` and free them in the engine."""
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(ServerAborted())
        if streams and self.serving:
            self._send(protocol.Abort(list(streams)))

    def _send(self, msg: protocol.Message) -> None:
        try:
            self._transport.requests.put(msg, timeout=PUT_TIMEOUT_S)
        except queue.Full as exc:
            raise Unavailable("the engine is not taking requests (its queue stayed full)") from exc

    # -- outputs ----------------------------------------------------------------------------------

    def _read(self, loop: asyncio.AbstractEventLoop, outputs: MessageQueue, stop: threading.Event) -> None:
        """Reader thread: block on the engine's output queue, hand batches to the event loop."""
        while not stop.is_set():
            try:
                messages = outputs.get_many(timeout=READ_TIMEOUT_S)
            except Empty:
                continue
            loop.call_soon_threadsafe(self._dispatch, messages)

    def _dispatch(self, messages: list[protocol.Message]) -> None:
        for msg in messages:
            if isinstance(msg, protocol.StepOutputs):
                self.num_steps = msg.step
                for delta in msg.outputs:
                    stream = self._streams.get(delta.request_id)
                    if stream is None:
                        continue  # aborted here already; the engine frees it on the Abort
                    stream.put_nowait(delta)
                    if delta.finish_reason is not None:
                        del self._streams[delta.request_id]
            elif isinstance(msg, protocol.EngineStats):
                self.stats = msg
            elif isinstance(msg, protocol.RequestRejected):
                stream = self._streams.pop(msg.request_id, None)
                if stream is not None:
                    stream.put_nowait(msg)
            elif isinstance(msg, protocol.Ready) and not self._ready.done():
                self._ready.set_result(msg)
            elif isinstance(msg, protocol.EngineError) and not self._ready.done():
                self._ready.set_exception(EngineStartError(msg.message))
