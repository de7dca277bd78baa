"""Decode attention kernel: time and achieved bandwidth vs the device's copy bandwidth.

    python -m engine.bench attention [--batch-sizes 1 16 64 256] [--context-lens 512 2048 8192]

Decode attention is memory-bound: every K/V byte of every context must be read once. For each
shape this prints microseconds per call (CUDA events), the GB/s that implies for those bytes
(plus query and output), and the ratio to the device's measured copy bandwidth (a large
device-to-device copy reads and writes each byte, so it counts 2 bytes per byte copied).
"""

from __future__ import annotations

import argparse

import torch

SHAPES = {  # name: (num_heads, num_kv_heads, head_dim)
    "smollm2": (9, 3, 64),
    "llama-8b": (32, 8, 128),
}
BLOCK_SIZE = 16


def time_us(fn, iters: int) -> float:
    """Median of `iters` CUDA-event timings of fn(), after a warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(num_bytes: int = 1 << 30) -> float:
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), 10)
    return 2 * num_bytes / us / 1e3


def bench_shape(kernels, num_seqs: int, context_len: int, num_heads: int, num_kv_heads: int,
                head_dim: int, dtype: torch.dtype, iters: int) -> tuple[float, float]:
    """(microseconds, bytes that must move) of one decode attention call."""
    blocks_per_seq = -(-context_len // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq + 1  # block 0: padding
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device="cuda")
    v_cache = torch.randn(shape, dtype=dtype, device="cuda")
    # Each sequence gets its own blocks, shuffled so reads are scattered as in a real cache.
    tables = (torch.randperm(num_blocks - 1, device="cuda") + 1).view(num_seqs, blocks_per_seq)
    lens = torch.full((num_seqs,), context_len, dtype=torch.long, device="cuda")
    q = torch.randn(num_seqs, num_heads, head_dim, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    us = time_us(lambda: kernels.paged_attention(out, q, k_cache, v_cache, tables, lens,
                                                 head_dim**-0.5, max_context_len=context_len), iters)
    kv_bytes = 2 * num_seqs * context_len * num_kv_heads * head_dim * dtype.itemsize
    return us, kv_bytes + 2 * q.numel() * dtype.itemsize


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.bench attention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--context-lens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("engine.bench attention needs a CUDA device (torch.cuda.is_available() "
                         "is False); it times the CUDA kernels of engine/kernels.py")
    try:
        from engine import kernels
    except ImportError as exc:
        raise SystemExit(f"engine.bench attention needs CuPy ({exc}): pip install -e '.[cuda]'")
    dtype = getattr(torch, args.dtype)
    copy_gbs = copy_bandwidth_gbs()
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth: {copy_gbs:.0f} GB/s  "
          f"dtype: {args.dtype}  block_size: {BLOCK_SIZE}  partition_size: {kernels.PARTITION_SIZE}")
    print(f"{'shape':>9} {'heads':>6} {'batch':>6} {'context':>8} {'us':>10} {'MB':>9} "
          f"{'GB/s':>8} {'of copy':>8}")
    for name in args.shapes:
        num_heads, num_kv_heads, head_dim = SHAPES[name]
        for num_seqs in args.batch_sizes:
            for context_len in args.context_lens:
                us, num_bytes = bench_shape(kernels, num_seqs, context_len, num_heads, num_kv_heads,
                                            head_dim, dtype, args.iters)
                gbs = num_bytes / us / 1e3
                print(f"{name:>9} {num_heads:>3}/{num_kv_heads:<2} {num_seqs:>6} {context_len:>8} "
                      f"{us:>10.1f} {num_bytes / 1e6:>9.1f} {gbs:>8.0f} {gbs / copy_gbs:>8.0%}")
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
