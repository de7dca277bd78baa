"""The shared-memory queue between real spawned processes (no mocks).

Every message carries its sequence number and a payload drawn from it, so a lost, repeated,
reordered, truncated or torn message cannot compare equal to the one expected. The ring is small
(64 KiB) and sizes are random, so the ends wrap at every offset, often in the middle of a message:

    0                                                                          RING_BYTES
    [ ..end of msg n | len | msg n+1 | ...... free ...... | len | start of msg n.. ]
                                     ^ tail (next put)     ^ head (next get)
"""

import contextlib
import ctypes
import math
import multiprocessing
import random
import threading
import time

from engine import protocol
from engine.ipc import Empty, Full, MessageQueue, MessageTooLarge

RING_BYTES = 64 << 10
HEADER_BYTES = ctypes.sizeof(ctypes.c_size_t)  # faster-fifo's length prefix before each message
LARGEST = RING_BYTES - HEADER_BYTES  # the largest encoded message an empty ring holds
WAIT_S = 20.0  # bound on every wait that should succeed, so a bug fails instead of hanging
NUM_STREAMED = 20_000  # messages each way in the two-way stress test
SPAWN = multiprocessing.get_context("spawn")


# ---- messages derived from their sequence number -------------------------------------------------

def pattern(seq: int, size: int) -> str:
    unit = f"{seq:x}."
    return (unit * (size // len(unit) + 1))[:size]


def stream(seed: int, n: int):
    """`n` messages of random sizes: log-uniform from 1 byte to a third of the ring."""
    rng = random.Random(seed)
    for seq in range(n):
        size = int(math.exp(rng.uniform(0.0, math.log(RING_BYTES // 3))))
        yield protocol.RequestRejected(str(seq), pattern(seq, size))


def sized(num_bytes: int) -> protocol.RequestRejected:
    """A message whose encoding is exactly `num_bytes` long."""
    overhead = len(protocol.encode(protocol.RequestRejected("big", "")))
    for length in range(num_bytes - overhead, 0, -1):  # longer strings take a longer msgpack header
        msg = protocol.RequestRejected("big", pattern(num_bytes, length))
        if len(protocol.encode(msg)) == num_bytes:
            return msg
    raise ValueError(f"no message encodes to {num_bytes} bytes")


def seconds_to_raise(error: type[Exception], call, *args, **kwargs) -> float:
    """How long `call` took to raise `error` (this module does not import pytest: the children
    import it, and pytest would double their start-up time)."""
    start = time.monotonic()
    try:
        call(*args, **kwargs)
    except error:
        return time.monotonic() - start
    raise AssertionError(f"{call.__name__} did not raise {error.__name__}")


# ---- child processes (module level: spawn pickles the target by name) -----------------------------

def send(queue: MessageQueue, seed: int, n: int) -> None:
    for msg in stream(seed, n):
        queue.put(msg, timeout=WAIT_S)


def receive(queue: MessageQueue, seed: int, n: int, batched: bool) -> str:
    """Take `n` messages and compare each with the stream; "ok" or what went wrong first."""
    expected = stream(seed, n)
    rng = random.Random(seed + 1)
    count = 0
    try:
        while count < n:
            if batched:
                batch = queue.get_many(timeout=WAIT_S, max_messages=min(rng.randint(1, 64), n - count))
            else:
                batch = [queue.get(timeout=WAIT_S)]
            for got in batch:
                want = next(expected, None)
                if got != want:
                    return (f"message {count}: expected {want and want.request_id} of "
                            f"{want and len(want.message)} chars, got {type(got).__name__} "
                            f"{getattr(got, 'request_id', '')} of {len(getattr(got, 'message', ''))}")
                count += 1
    except Empty:
        return f"only {count} of {n} messages arrived"
    except Exception as exc:  # a torn message can fail to decode
        return f"after {count} messages: {exc!r}"
    return "ok"


def exchange(to_parent: MessageQueue, to_child: MessageQueue, n: int) -> None:
    """Stream `n` messages to the parent while checking the `n` it streams here; then the verdict."""
    verdict = []
    reader = threading.Thread(target=lambda: verdict.append(receive(to_child, 2, n, batched=False)))
    reader.start()
    send(to_parent, 1, n)
    reader.join()
    to_parent.put(protocol.EngineError(verdict[0]), timeout=WAIT_S)


def echo(inbox: MessageQueue, outbox: MessageQueue) -> None:
    """Send back everything, up to and including a Shutdown."""
    while True:
        msg = inbox.get(timeout=WAIT_S)
        outbox.put(msg, timeout=WAIT_S)
        if isinstance(msg, protocol.Shutdown):
            return


def block_and_report(inbox: MessageQueue, report: MessageQueue) -> None:
    """Block in get(), then in get_many(), and report the CPU and wall seconds each took."""
    for take in (inbox.get, inbox.get_many):
        report.put(protocol.Abort(["blocking"]), timeout=WAIT_S)
        cpu, wall = time.process_time(), time.monotonic()
        take(timeout=WAIT_S)
        report.put(protocol.Abort([repr(time.process_time() - cpu), repr(time.monotonic() - wall)]),
                   timeout=WAIT_S)


@contextlib.contextmanager
def child(target, *args):
    """A spawned process that must exit cleanly; killed if the test fails first."""
    proc = SPAWN.Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        yield proc
        proc.join(WAIT_S)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


# ---- tests -----------------------------------------------------------------------------------------

def test_two_way_stream_through_a_small_ring_arrives_exactly_once_in_order_intact():
    to_parent, to_child = MessageQueue(RING_BYTES), MessageQueue(RING_BYTES)
    with child(exchange, to_parent, to_child, NUM_STREAMED):
        sender = threading.Thread(target=send, args=(to_child, 2, NUM_STREAMED), daemon=True)
        sender.start()
        assert receive(to_parent, 1, NUM_STREAMED, batched=True) == "ok"  # child -> parent
        assert to_parent.get(timeout=WAIT_S) == protocol.EngineError("ok")  # parent -> child
        sender.join(WAIT_S)
        assert not sender.is_alive()


def test_largest_message_passes_intact_and_one_byte_more_fails_at_once():
    inbox, outbox = MessageQueue(RING_BYTES), MessageQueue(RING_BYTES)
    largest = sized(LARGEST)
    with child(echo, inbox, outbox):
        for _ in range(3):  # each pass starts the ring at a different offset, so it wraps
            inbox.put(largest, timeout=WAIT_S)
            assert outbox.get(timeout=WAIT_S) == largest
            inbox.put(protocol.Abort(["x" * 100]), timeout=WAIT_S)
            assert outbox.get(timeout=WAIT_S) == protocol.Abort(["x" * 100])
        for too_large in (sized(LARGEST + 1), sized(RING_BYTES), sized(4 * RING_BYTES)):
            assert seconds_to_raise(MessageTooLarge, inbox.put, too_large, timeout=5.0) < 0.5  # not 5
        inbox.put(protocol.Shutdown(), timeout=WAIT_S)  # still usable
        assert outbox.get(timeout=WAIT_S) == protocol.Shutdown()


def test_full_queue_times_out_then_accepts_again_without_loss():
    requests, echoes = MessageQueue(RING_BYTES), MessageQueue(1 << 20)

    def msg(seq: int) -> protocol.RequestRejected:
        return protocol.RequestRejected(f"{seq:06d}", pattern(seq, 1000))

    seq = 0
    while True:  # nobody reads yet: fill the ring until a put times out
        start = time.monotonic()
        try:
            requests.put(msg(seq), timeout=0.2)
        except Full:
            waited = time.monotonic() - start
            break
        seq += 1
    assert 0.15 <= waited < 2.0
    assert seq == RING_BYTES // (len(protocol.encode(msg(0))) + HEADER_BYTES) == 64  # 1,012 + 8 bytes

    with child(echo, requests, echoes):  # the consumer starts now and drains the ring
        total = seq + 200
        for seq in range(seq, total):  # the one that timed out is sent again
            requests.put(msg(seq), timeout=WAIT_S)
        requests.put(protocol.Shutdown(), timeout=WAIT_S)
        got = []
        while not isinstance(last := echoes.get(timeout=WAIT_S), protocol.Shutdown):
            got.append(last)
    assert [m.request_id for m in got] == [f"{i:06d}" for i in range(total)]
    assert got == [msg(i) for i in range(total)]


def test_get_timeouts_and_get_many_order():
    queue = MessageQueue(RING_BYTES)
    for take in (queue.get, queue.get_many):
        assert 0.15 <= seconds_to_raise(Empty, take, timeout=0.2) < 2.0
        assert seconds_to_raise(Empty, take, timeout=0) < 0.05

    # 30 KB queued: more than faster-fifo's first receive buffer (5 KB) takes in one call.
    sent = [protocol.RequestRejected(str(i), pattern(i, 1000)) for i in range(30)]
    for msg in sent:
        queue.put(msg, timeout=0)
    assert queue.get_many(timeout=0) == sent
    for msg in sent[:10]:
        queue.put(msg, timeout=0)
    assert queue.get_many(timeout=0, max_messages=4) == sent[:4]
    assert queue.get(timeout=0) == sent[4]
    assert queue.get_many(timeout=WAIT_S) == sent[5:10]
    assert seconds_to_raise(Empty, queue.get_many, timeout=0) < 0.05


def test_negative_timeout_means_now_not_forever():
    queue, outcomes = MessageQueue(RING_BYTES), []

    def take_all():
        for take in (queue.get, queue.get_many):
            try:
                take(timeout=-1.0)
            except Empty:
                outcomes.append("empty")

    waiter = threading.Thread(target=take_all, daemon=True)  # a hang stays in this thread
    waiter.start()
    waiter.join(5.0)
    assert outcomes == ["empty", "empty"]


def test_blocked_consumer_does_not_spin():
    inbox, report = MessageQueue(RING_BYTES), MessageQueue(RING_BYTES)
    with child(block_and_report, inbox, report):
        for _ in range(2):  # get(), then get_many()
            assert report.get(timeout=WAIT_S) == protocol.Abort(["blocking"])
            time.sleep(0.5)
            inbox.put(protocol.Shutdown(), timeout=WAIT_S)
            cpu_s, wall_s = map(float, report.get(timeout=WAIT_S).request_ids)
            assert wall_s >= 0.4
            assert cpu_s < 0.05  # a spinning consumer would use about wall_s
