"""Command line of `python -m service`; every flag has a `TURNSTILE_*` environment variable.

    --max-num-seqs 32   ==   TURNSTILE_MAX_NUM_SEQS=32      (the flag wins when both are given)

Engine knobs become an `EngineConfig` (validated there); the rest is the frozen `ServiceConfig`.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

from engine.config import ATTENTION_BACKENDS, EngineConfig, POLICIES, SCHEDULING_MODES, DTYPES


@dataclass(frozen=True)
class ServiceConfig:
    engine: EngineConfig
    host: str = "0.0.0.0"
    port: int = 50051
    max_queue_size: int = 256  # requests waiting beyond the max_num_seqs running ones
    max_tokens_cap: int = 4096
    max_stop_strings: int = 16
    api_key: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    shutdown_grace_s: float = 30.0
    engine_start_timeout_s: float = 600.0
    max_engine_restarts: int = 10  # 0: exit non-zero when the engine dies

    def __post_init__(self) -> None:
        if self.max_tokens_cap <= 0:
            raise ValueError(f"max_tokens_cap must be positive, got {self.max_tokens_cap}")
        for name in ("port", "max_queue_size", "max_stop_strings", "max_engine_restarts", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _memory(text: str) -> int:
    """'1GiB', '512MiB', '4096' (bytes) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(|B|KiB|MiB|GiB)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size like 1GiB, 512MiB or a byte count, got {text!r}")
    scale = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[match.group(2)]
    return int(float(match.group(1)) * scale)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description="Serve a Llama-family model over gRPC (turnstile.v1.GenerationService) with "
                    "continuous batching. Every flag can also be set as TURNSTILE_<FLAG>, e.g. "
                    "TURNSTILE_MAX_NUM_SEQS=32.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="default", help="'default' (embedded SmolLM2-135M-Instruct), "
                       "a .gguf file or a Hugging Face directory")
    model.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    model.add_argument("--dtype", default="float32", choices=DTYPES)
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int, default=64, help="sequences in one step")
    engine.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens in one step")
    engine.add_argument("--max-model-len", type=int, default=None, help="prompt + output limit "
                        "(default: the model's)")
    engine.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    engine.add_argument("--num-kv-blocks", type=int, default=None, help="KV cache blocks "
                        "(default: as many as --kv-cache-memory holds)")
    engine.add_argument("--kv-cache-memory", type=_memory, default=1 << 30,
                        help="KV cache budget, e.g. 1GiB or 512MiB")
    engine.add_argument("--scheduling", default="continuous", choices=SCHEDULING_MODES)
    engine.add_argument("--policy", default="fcfs", choices=POLICIES)
    engine.add_argument("--enable-prefix-caching", default=True, action=argparse.BooleanOptionalAction)
    engine.add_argument("--num-threads", type=int, default=None, help="CPU threads of the engine")
    engine.add_argument("--seed", type=int, default=0, help="seed of unseeded requests' draws")
    engine.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                        help="auto: the CUDA kernels (CuPy) on a CUDA device, else torch")
    add("--host", default="0.0.0.0", help="address to listen on")
    add("--port", type=int, default=50051, help="gRPC port (0: any free port)")
    add("--max-queue-size", type=int, default=256, help="requests that may wait beyond the "
        "--max-num-seqs running ones; more get RESOURCE_EXHAUSTED")
    add("--max-tokens-cap", type=int, default=4096, help="largest max_tokens a request may ask for")
    add("--max-stop-strings", type=int, default=16, help="most stop strings in one request")
    add("--api-key", default=None, help="require 'authorization: Bearer <key>' metadata")
    add("--tls-cert", default=None, help="PEM certificate chain; serves TLS with --tls-key")
    add("--tls-key", default=None, help="PEM private key")
    add("--shutdown-grace-s", type=float, default=30.0, help="on SIGTERM, how long in-flight "
        "requests may take to finish")
    add("--engine-start-timeout-s", type=float, default=600.0, help="model load time allowed")
    add("--max-engine-restarts", type=int, default=10, help="engine restarts before giving up "
        "(0: exit when the engine dies)")
    return parser


def parse_config(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> ServiceConfig:
    """Parse flags over `TURNSTILE_*` environment defaults; errors exit with a usage message."""
    parser = build_parser()
    environ = os.environ if environ is None else environ
    for action in parser._actions:
        env = "TURNSTILE_" + action.dest.upper()
        if action.dest == "help" or env not in environ:
            continue
        raw = environ[env]
        try:
            if isinstance(action, argparse.BooleanOptionalAction):
                value = _boolean(raw)
            else:
                value = action.type(raw) if action.type else raw
        except (ValueError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{env}={raw!r}: {exc}")
        if action.choices and value not in action.choices:
            parser.error(f"{env}={raw!r}: choose from {', '.join(map(str, action.choices))}")
        action.default = value
    args = vars(parser.parse_args(argv))
    engine_keys = ("model", "device", "dtype", "max_num_seqs", "max_num_batched_tokens",
                   "max_model_len", "block_size", "num_kv_blocks", "scheduling", "policy",
                   "enable_prefix_caching", "num_threads", "seed", "attention_backend")
    try:
        engine = EngineConfig(kv_cache_memory_bytes=args.pop("kv_cache_memory"),
                              **{key: args.pop(key) for key in engine_keys})
        return ServiceConfig(engine=engine, **args)
    except ValueError as exc:
        parser.error(str(exc))


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")
