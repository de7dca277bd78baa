"""Through gRPC versus in-process: what the service and the shared-memory queue cost, in one run.

    python -m engine.bench serving [--requests 32] [--min-tokens 8] [--max-tokens 256]

1. The shared-memory queue's round trips (engine.bench.ipc), p50 and p99.
2. The same workload, alternating: the offline `LLM` in this process, then `python -m service` in
   a subprocess (engine in its own process) driven by the async client, every request sent at
   t=0. Same engine config, greedy, `ignore_eos`, so both produce exactly the same tokens. The
   server stays up (its engine asleep) while the offline run goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.bench import ipc

ENGINE_FLAGS = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "max_model_len": 2048}


class Offline:
    """The offline `LLM` in this process."""

    def __init__(self, prompts: list[str]) -> None:
        from engine import LLM, SamplingParams

        self.llm = LLM(model="default", **ENGINE_FLAGS)
        self.llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up

    def run(self, prompts: list[str], lengths: list[int]) -> tuple[float, list[list[int]]]:
        from engine import SamplingParams

        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params)
        return sum(lengths) / (time.perf_counter() - start), [o.token_ids for o in outputs]


class Served:
    """`python -m service` in a subprocess, driven by the async client over loopback."""

    def __init__(self, prompts: list[str]) -> None:
        from turnstile_client import Client

        with socket.socket() as sock:
            sock.bind(("localhost", 0))
            port = sock.getsockname()[1]
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
        self.server = subprocess.Popen([sys.executable, "-m", "service", "--host", "localhost",
                                        f"--port={port}", *flags], stderr=subprocess.DEVNULL)
        self.address = f"localhost:{port}"
        with Client(self.address, timeout=600) as client:
            _wait_serving(client, self.server)
            client.generate(prompts[0], max_tokens=4, temperature=0)  # warm-up

    def run(self, prompts: list[str], lengths: list[int]) -> tuple[float, list[list[int]]]:
        from turnstile_client import AsyncClient

        async def run_all() -> list:
            async with AsyncClient(self.address, timeout=600) as client:
                return await asyncio.gather(*[
                    client.generate(p, max_tokens=n, temperature=0, ignore_eos=True)
                    for p, n in zip(prompts, lengths)])

        start = time.perf_counter()
        completions = asyncio.run(run_all())
        return sum(lengths) / (time.perf_counter() - start), [c.token_ids for c in completions]

    def close(self) -> None:
        self.server.terminate()
        self.server.wait(60)


def _wait_serving(client, server: subprocess.Popen) -> None:
    from turnstile_client import UnavailableError

    while True:
        if server.poll() is not None:
            raise SystemExit("the server exited while starting")
        try:
            client.model_info()
            client.tokenize("ready?")
            return
        except UnavailableError:
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.bench serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="offline/gRPC pairs, interleaved")
    parser.add_argument("--out", type=Path, default=Path("bench-results/serving.json"))
    args = parser.parse_args(argv)

    rng = random.Random(0)
    lengths = [rng.randint(args.min_tokens, args.max_tokens) for _ in range(args.requests)]
    prompts = [f"Request {i}: write about the number {i}." for i in range(args.requests)]

    print("shared-memory queue round trips (engine.bench.ipc):")
    ipc.main(["--round-trips", "1000"])
    print()
    offline, served = Offline(prompts), Served(prompts)
    rows = []
    try:
        for _ in range(args.repeat):  # interleaved, so drifts of this shared machine hit both
            rows.append((*offline.run(prompts, lengths), *served.run(prompts, lengths)))
    finally:
        served.close()
    print(f"{args.requests} requests, {sum(lengths)} output tokens "
          f"({args.min_tokens}..{args.max_tokens} each), all at t=0; {args.repeat} interleaved runs")
    print(f"{'run':>4}{'offline LLM tok/s':>20}{'gRPC + engine process tok/s':>30}{'ratio':>8}"
          f"{'same tokens':>13}")
    for i, (off, off_ids, srv, srv_ids) in enumerate(rows, 1):
        same = sum(a == b for a, b in zip(off_ids, srv_ids))
        print(f"{i:>4}{off:>20.1f}{srv:>30.1f}{srv / off:>8.3f}{same:>9}/{args.requests}")
    ratios = [srv / off for off, _, srv, _ in rows]
    print(f"median ratio gRPC / offline: {statistics.median(ratios):.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"lengths": lengths, "offline_tok_s": [r[0] for r in rows],
                                    "served_tok_s": [r[2] for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
