"""Queue round-trip latency between the service and a spawned process, and what the codec costs.

    python -m engine.bench ipc [--round-trips 2000] [--warmup 200]

One round trip: this process puts a message, a spawned echo process gets it and puts it back on
the second queue, this process gets it. That is two msgpack encodes, two decodes, two copies into
and out of the shared-memory ring and two wake-ups of a sleeping reader. "codec" is one encode plus
one decode here alone, so "queue" (round trip minus two codecs) is roughly the rings' own share.
Torch-free: the child starts in well under a second.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time

from engine import protocol
from engine.ipc import DEFAULT_MAX_SIZE_BYTES, MessageQueue
from engine.sampling_params import SamplingParams

WAIT_S = 30.0  # a dead echo process fails the run instead of hanging it


def messages() -> dict[str, protocol.Message]:
    rng = random.Random(0)
    prompt = [rng.randrange(128_000) for _ in range(16_384)]  # Llama-3-sized vocabulary
    return {
        "StepOutputs, 1 delta": protocol.StepOutputs(1, [protocol.SequenceDelta("req-0", [1234])]),
        "StepOutputs, 64 deltas": protocol.StepOutputs(
            1, [protocol.SequenceDelta(f"req-{i}", [1000 + i]) for i in range(64)]),
        "AddRequest, 16k-token prompt": protocol.AddRequest(
            "req-0", prompt, SamplingParams(max_tokens=256, temperature=0.7), 0, time.monotonic()),
    }


def echo(inbox: MessageQueue, outbox: MessageQueue) -> None:
    """The child: send back everything, up to and including a Shutdown."""
    while True:
        msg = inbox.get(timeout=WAIT_S)
        outbox.put(msg, timeout=WAIT_S)
        if isinstance(msg, protocol.Shutdown):
            return


def round_trips_us(inbox: MessageQueue, outbox: MessageQueue, msg: protocol.Message, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        inbox.put(msg, timeout=WAIT_S)
        outbox.get(timeout=WAIT_S)
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def codec_us(msg: protocol.Message, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        protocol.decode(protocol.encode(msg))
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.bench ipc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=2000, help="timed round trips per message")
    ap.add_argument("--warmup", type=int, default=200, help="untimed round trips per message first")
    ap.add_argument("--queue-bytes", type=int, default=DEFAULT_MAX_SIZE_BYTES)
    args = ap.parse_args(argv)

    inbox, outbox = MessageQueue(args.queue_bytes), MessageQueue(args.queue_bytes)
    child = multiprocessing.get_context("spawn").Process(target=echo, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        print(f"{'message':29} {'bytes':>7} {'codec p50 us':>12} {'round trip p50 us':>17} "
              f"{'p99 us':>8} {'queue p50 us':>12}")
        for name, msg in messages().items():
            round_trips_us(inbox, outbox, msg, args.warmup)
            trips = round_trips_us(inbox, outbox, msg, args.round_trips)
            codec = percentile(codec_us(msg, args.round_trips), 0.5)
            trip = percentile(trips, 0.5)
            print(f"{name:29} {len(protocol.encode(msg)):7d} {codec:12.1f} {trip:17.1f} "
                  f"{percentile(trips, 0.99):8.1f} {trip - 2 * codec:12.1f}", flush=True)
        inbox.put(protocol.Shutdown(), timeout=WAIT_S)
        outbox.get(timeout=WAIT_S)
        child.join(WAIT_S)
    finally:
        if child.is_alive():
            child.kill()


if __name__ == "__main__":
    main()
