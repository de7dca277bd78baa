"""Through gRPC versus in-process: what the service and the shared-memory queue cost, in one run.

    python -m engine.bench serving [--requests 32] [--min-tokens 8] [--max-tokens 256]

1. The shared-memory queue's round trips (engine.bench.ipc), p50 and p99.
2. The same workload twice: the offline `LLM` in this process, then `python -m service` in a
   subprocess (engine in its own process) driven by the async client, every request sent at t=0.
   Same engine config, greedy, `ignore_eos`, so both produce exactly the same tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.bench import ipc

ENGINE_FLAGS = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "max_model_len": 2048}


def offline_tokens_per_s(prompts: list[str], lengths: list[int]) -> tuple[float, list[list[int]]]:
    from engine import LLM, SamplingParams

    llm = LLM(model="default", **ENGINE_FLAGS)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    del llm
    return sum(lengths) / elapsed, [o.token_ids for o in outputs]


def served_tokens_per_s(prompts: list[str], lengths: list[int]) -> tuple[float, list[list[int]]]:
    from turnstile_client import AsyncClient, Client

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    server = subprocess.Popen([sys.executable, "-m", "service", "--host", "localhost",
                               f"--port={port}", *flags], stderr=subprocess.DEVNULL)
    address = f"localhost:{port}"
    try:
        with Client(address, timeout=600) as client:
            _wait_serving(client, server)
            client.generate(prompts[0], max_tokens=4, temperature=0)  # warm-up

        async def run() -> list:
            async with AsyncClient(address, timeout=600) as client:
                return await asyncio.gather(*[
                    client.generate(p, max_tokens=n, temperature=0, ignore_eos=True)
                    for p, n in zip(prompts, lengths)])

        start = time.perf_counter()
        completions = asyncio.run(run())
        elapsed = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(60)
    return sum(lengths) / elapsed, [c.token_ids for c in completions]


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
    parser.add_argument("--out", type=Path, default=Path("bench-results/serving.json"))
    args = parser.parse_args(argv)

    rng = random.Random(0)
    lengths = [rng.randint(args.min_tokens, args.max_tokens) for _ in range(args.requests)]
    prompts = [f"Request {i}: write about the number {i}." for i in range(args.requests)]

    print("shared-memory queue round trips (engine.bench.ipc):")
    ipc.main(["--round-trips", "1000"])
    print()
    offline, offline_ids = offline_tokens_per_s(prompts, lengths)
    served, served_ids = served_tokens_per_s(prompts, lengths)
    print(f"{args.requests} requests, {sum(lengths)} output tokens "
          f"({args.min_tokens}..{args.max_tokens} each), all at t=0")
    print(f"{'path':<34}{'tok/s':>8}{'ratio':>8}")
    print(f"{'offline LLM (in-process)':<34}{offline:>8.1f}{1.0:>8.2f}")
    print(f"{'gRPC + engine process':<34}{served:>8.1f}{served / offline:>8.2f}")
    same = sum(a == b for a, b in zip(offline_ids, served_ids))
    print(f"identical greedy outputs: {same}/{args.requests}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"lengths": lengths, "offline_tok_s": offline,
                                    "served_tok_s": served, "identical": same}, indent=2))


if __name__ == "__main__":
    main()
