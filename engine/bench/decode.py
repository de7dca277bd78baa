"""Decode throughput: this engine vs Hugging Face `generate`, same weights and prompts, one run.

    python -m engine.bench decode [--batch-sizes 1 8 32 64] [--dtypes float32 bfloat16]

Decode tokens/s excludes prefill: for the engine, the steps after every prompt is in; for HF, the
difference between generating N tokens and 1 token. A profile of a few engine decode steps splits
the step time into matmuls, attention (gather + softmax), other tensor ops and Python overhead.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import profile

from engine.bench.hf import hf_generate_seconds, load_hf_model
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from engine.tokenizer import load_tokenizer

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::mkldnn_linear", "mkldnn::_linear_pointwise",
              "aten::linear", "aten::matmul")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index",
                 "aten::index_copy_", "aten::_scaled_dot_product_attention_math")


def make_prompts(tokenizer, batch_size: int) -> list[list[int]]:
    topics = ["the sea", "a robot", "autumn", "mathematics", "a city at night", "coffee", "trains"]
    return [tokenizer.encode(f"Write a short story about {topics[i % len(topics)]}, part {i}:")
            for i in range(batch_size)]


def engine_decode(core: EngineCore, prompts: list[list[int]], num_tokens: int) -> tuple[float, dict]:
    """Decode tokens/s over steady-state steps (timed without the profiler), then a profile of
    three more steps for the cost breakdown."""
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(f"bench-{len(prompts)}-{i}", p, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.scheduler.requests.values()):
        core.step()  # prefill until every prompt is in
    timed_steps = max(1, num_tokens - 6)
    start = time.perf_counter()
    for _ in range(timed_steps):
        core.step()
    tokens_per_s = len(prompts) * timed_steps / (time.perf_counter() - start)
    breakdown = profile_steps(core, 3)
    while core.has_unfinished_requests():
        core.step()
    return tokens_per_s, breakdown


def profile_steps(core: EngineCore, n: int) -> dict:
    with profile() as prof:
        start = time.perf_counter()
        for _ in range(n):
            core.step()
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1e6
    attention = sum(e.self_cpu_time_total for e in events if e.key in ATTENTION_OPS) / 1e6
    total_ops = sum(e.self_cpu_time_total for e in events) / 1e6
    per = lambda x: 1000 * x / n  # noqa: E731  ms per step
    return {"step_ms": per(wall), "matmul_ms": per(matmul), "attention_ms": per(attention),
            "other_ops_ms": per(total_ops - matmul - attention),
            "python_ms": per(max(0.0, wall - total_ops))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.bench decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--num-tokens", type=int, default=40, help="new tokens per request (>= 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face baseline")
    args = ap.parse_args(argv)
    if args.num_tokens < 10:
        ap.error("--num-tokens must be >= 10 (steady-state steps plus 3 profiled ones)")
    torch.set_num_threads(args.threads)
    print(HEADER)
    rows = []
    for dtype in args.dtypes:
        core = EngineCore(EngineConfig(model=args.model, dtype=dtype, num_threads=args.threads,
                                       max_num_seqs=max(args.batch_sizes), enable_prefix_caching=False))
        tokenizer = load_tokenizer(core.model_path)
        hf = None if args.no_hf else load_hf_model(args.model, getattr(torch, dtype))
        for bs in args.batch_sizes:
            prompts = make_prompts(tokenizer, bs)
            ours, breakdown = engine_decode(core, prompts, args.num_tokens)
            hf_tps = float("nan")
            if hf is not None:
                t_n = hf_generate_seconds(hf, tokenizer, prompts, args.num_tokens)
                t_1 = hf_generate_seconds(hf, tokenizer, prompts, 1)
                hf_tps = bs * (args.num_tokens - 1) / max(t_n - t_1, 1e-9)
            rows.append((dtype, bs, ours, hf_tps, breakdown))
            print_row(*rows[-1], flush=True)
        del core, hf


HEADER = (f"{'dtype':9} {'batch':>5} {'turnstile tok/s':>15} {'HF tok/s':>9} {'ratio':>6} | "
          f"{'step ms':>7} {'matmul':>7} {'attn':>6} {'other':>6} {'python':>6}")


def print_row(dtype, bs, ours, hf_tps, b, flush=False):
    print(f"{dtype:9} {bs:5d} {ours:15.1f} {hf_tps:9.1f} {ours / hf_tps:6.2f} | "
          f"{b['step_ms']:7.1f} {b['matmul_ms']:7.1f} {b['attention_ms']:6.1f} "
          f"{b['other_ops_ms']:6.1f} {b['python_ms']:6.1f}", flush=flush)


if __name__ == "__main__":
    main()
