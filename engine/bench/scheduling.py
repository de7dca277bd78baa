"""The seeds' comparison: continuous vs static batching vs Hugging Face padded batches, one run.

    python -m engine.bench scheduling [--workloads A B C] [--no-hf] [--out bench-results/scheduling.json]

Same engine, same weights, same requests. More requests than batch slots, so a queue forms. Every
request arrives at t=0 and uses `ignore_eos`, so output lengths are exact. Latency is a request's
finish time. "predicted" is the static/continuous step ratio that the output lengths alone imply
(static: each batch lasts as long as its longest member; continuous: a freed slot is refilled at
once); "measured" counts the engine's real steps, prefill chunks included.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.bench.hf import hf_generate_seconds, load_hf_model
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from engine.tokenizer import load_tokenizer
from engine.weights import resolve_model_path


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    max_num_seqs: int
    lengths: tuple[int, ...]  # max_tokens of each request, in arrival order


def workloads(seed: int = 0) -> dict[str, Workload]:
    rng = random.Random(seed)
    heavy = tuple(rng.randint(200, 800) if rng.random() < 0.1 else rng.randint(3, 50) for _ in range(96))
    uniform = tuple(rng.randint(8, 256) for _ in range(32))
    return {
        "A": Workload("A", "seeds' high variance: 96 req, 90% 3..50 / 10% 200..800 tokens", 16, heavy),
        "B": Workload("B", "32 req, uniform 8..256 tokens", 32, uniform),
        "C": Workload("C", "64 req, all 128 tokens (static's best case)", 64, (128,) * 64),
    }


def predicted_steps(lengths: tuple[int, ...], slots: int) -> tuple[int, int]:
    """(static, continuous) decode steps implied by the output lengths alone."""
    static = sum(max(lengths[i:i + slots]) for i in range(0, len(lengths), slots))
    free_at = [0] * slots  # continuous: each request takes the earliest free slot
    for n in lengths:
        heapq.heappush(free_at, heapq.heappop(free_at) + n)
    return static, max(free_at)


def make_prompts(tokenizer, n: int) -> list[list[int]]:
    topics = ["the sea", "a robot", "autumn", "prime numbers", "a night train", "coffee", "bees"]
    return [tokenizer.encode(f"Request {i}: write about {topics[i % len(topics)]}.") for i in range(n)]


def run_engine(args, w: Workload, scheduling: str, prompts: list[list[int]]) -> dict:
    core = EngineCore(EngineConfig(model=args.model, num_threads=args.threads, scheduling=scheduling,
                                   max_num_seqs=w.max_num_seqs, enable_prefix_caching=False))
    sched_time = [0.0]
    for name in ("schedule", "update"):  # measure the scheduler's own per-step cost
        method = getattr(core.scheduler, name)

        def timed(*a, _m=method, **k):
            t = time.perf_counter()
            try:
                return _m(*a, **k)
            finally:
                sched_time[0] += time.perf_counter() - t
        setattr(core.scheduler, name, timed)
    start = time.perf_counter()
    for i, (p, n) in enumerate(zip(prompts, w.lengths)):
        core.add_request(str(i), p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    latencies, tokens = [], 0
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens += len(delta.new_token_ids)
            if delta.finish_reason is not None:
                latencies.append(time.perf_counter() - start)
    wall = time.perf_counter() - start
    return summary(scheduling, tokens, wall, latencies, core.num_steps,
                   sched_ms_per_step=1000 * sched_time[0] / core.num_steps)


def run_hf(hf, tokenizer, w: Workload, prompts: list[list[int]]) -> dict:
    start, latencies, steps = time.perf_counter(), [], 0
    for i in range(0, len(prompts), w.max_num_seqs):
        batch_lengths = w.lengths[i:i + w.max_num_seqs]
        hf_generate_seconds(hf, tokenizer, prompts[i:i + w.max_num_seqs], max(batch_lengths))
        steps += max(batch_lengths)
        latencies += [time.perf_counter() - start] * len(batch_lengths)
    wall = time.perf_counter() - start
    return summary("hf-generate", sum(w.lengths), wall, latencies, steps)  # useful tokens only


def summary(name, tokens, wall, latencies, steps, **extra) -> dict:
    ordered = sorted(latencies)
    return {"system": name, "output_tok_s": tokens / wall, "requests_s": len(latencies) / wall,
            "mean_latency_s": statistics.fmean(ordered),
            "p99_latency_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "steps": steps, "wall_s": wall, **extra}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.bench scheduling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--workloads", nargs="+", default=["A", "B", "C"], choices=["A", "B", "C"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face baseline rows")
    ap.add_argument("--out", default="bench-results/scheduling.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(resolve_model_path(args.model))
    hf = None if args.no_hf else load_hf_model(args.model, torch.float32)
    results = {}
    for key in args.workloads:
        w = workloads()[key]
        prompts = make_prompts(tokenizer, len(w.lengths))
        static_pred, cont_pred = predicted_steps(w.lengths, w.max_num_seqs)
        rows = [run_engine(args, w, "continuous", prompts), run_engine(args, w, "static", prompts)]
        if hf is not None:
            rows.append(run_hf(hf, tokenizer, w, prompts))
        measured = rows[1]["steps"] / rows[0]["steps"]
        results[key] = {"workload": w.description, "max_num_seqs": w.max_num_seqs,
                        "output_tokens": sum(w.lengths), "rows": rows,
                        "step_ratio_predicted": static_pred / cont_pred, "step_ratio_measured": measured}
        print_table(key, results[key])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.out}")


def print_table(key: str, r: dict) -> None:
    print(f"\nWorkload {key}: {r['workload']}; max_num_seqs {r['max_num_seqs']}, "
          f"{r['output_tokens']} output tokens")
    print(f"{'system':12} {'tok/s':>8} {'req/s':>7} {'mean lat s':>10} {'p99 lat s':>9} "
          f"{'steps':>6} {'sched ms/step':>13}")
    for row in r["rows"]:
        sched = f"{row['sched_ms_per_step']:.3f}" if "sched_ms_per_step" in row else "-"
        print(f"{row['system']:12} {row['output_tok_s']:8.1f} {row['requests_s']:7.2f} "
              f"{row['mean_latency_s']:10.2f} {row['p99_latency_s']:9.2f} {row['steps']:6d} {sched:>13}")
    cont, static = r["rows"][0], r["rows"][1]
    print(f"continuous/static tok/s: {cont['output_tok_s'] / static['output_tok_s']:.2f}x; "
          f"step ratio static/continuous: predicted {r['step_ratio_predicted']:.2f}, "
          f"measured {r['step_ratio_measured']:.2f}")
    if len(r["rows"]) > 2:
        print(f"continuous/HF tok/s: {cont['output_tok_s'] / r['rows'][2]['output_tok_s']:.2f}x")


if __name__ == "__main__":
    main()
