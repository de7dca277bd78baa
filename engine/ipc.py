"""The shared-memory queue between the service and the engine process.

One `MessageQueue` per direction, each a single-producer/single-consumer ring in shared memory from
`faster-fifo` (a circular byte buffer guarded by a process-shared mutex and condition variables):

    producer ──put(msg)──► [ len | msgpack bytes | len | msgpack bytes | ... free ... ] ──get()──► consumer

Messages are `engine.protocol` structs, msgpack-encoded on `put` and decoded on `get`. Waits
block on the condition variable, so an idle engine sleeps instead of spinning; every wait is
bounded by a timeout so both sides can notice a dead peer. A message that can never fit the ring
raises `MessageTooLarge` at once instead of blocking forever.

Queues must be created before the engine process starts and passed to it as `Process` arguments
(the ring lives in an anonymous shared mapping inherited by the child); there are no global names.
"""

from __future__ import annotations

import ctypes
import queue

import faster_fifo

from engine import protocol

DEFAULT_MAX_SIZE_BYTES = 32 << 20
# faster-fifo stores each message behind a size_t length prefix (8 bytes on 64-bit Linux).
_HEADER_BYTES = ctypes.sizeof(ctypes.c_size_t)

Empty = queue.Empty
Full = queue.Full


class MessageTooLarge(ValueError):
    pass


class MessageQueue:
    def __init__(self, max_size_bytes: int = DEFAULT_MAX_SIZE_BYTES) -> None:
        self.max_size_bytes = max_size_bytes
        # put() encodes itself (to check the size first); get() decodes straight from the ring.
        self._ring = faster_fifo.Queue(max_size_bytes=max_size_bytes, dumps=_as_is, loads=protocol.decode)

    def put(self, msg: protocol.Message, timeout: float | None = None) -> None:
        """Enqueue `msg`, waiting up to `timeout` seconds for room (None: wait as long as it takes).

        Raises `Full` when the wait times out and `MessageTooLarge` if it could never fit.
        """
        data = protocol.encode(msg)
        if len(data) + _HEADER_BYTES > self.max_size_bytes:
            raise MessageTooLarge(f"{type(msg).__name__} of {len(data)} bytes does not fit a queue "
                                  f"of {self.max_size_bytes} bytes")
        self._ring.put(data, block=True, timeout=_forever(timeout))

    def get(self, timeout: float | None = None) -> protocol.Message:
        """The oldest message, waiting up to `timeout` seconds (0: do not wait). Raises `Empty`."""
        return self._ring.get(block=timeout != 0, timeout=_forever(timeout))

    def get_many(self, timeout: float | None = None, max_messages: int = 1024) -> list[protocol.Message]:
        """Every queued message (at least one, at most `max_messages`), oldest first, waiting up to
        `timeout` for the first. Raises `Empty`."""
        messages = self._ring.get_many(block=timeout != 0, timeout=_forever(timeout),
                                       max_messages_to_get=max_messages)
        # faster-fifo returns only what fits its receive buffer (5 KB at first, grown after each
        # shortfall), so one call can leave messages behind; take those too, without waiting.
        while len(messages) < max_messages:
            try:
                messages += self._ring.get_many(block=False, max_messages_to_get=max_messages - len(messages))
            except Empty:
                break
        return messages


def _forever(timeout: float | None) -> float:
    # faster-fifo takes a number of seconds; "None = no limit" becomes a very long wait. A negative
    # number would wrap to an endless wait in its C code, so a deadline already past means "now".
    return 1e9 if timeout is None else max(timeout, 0.0)


def _as_is(data: bytes) -> bytes:
    return data
