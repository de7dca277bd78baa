"""Engine configuration: frozen dataclasses, validated on construction.

`ModelConfig` describes the checkpoint (read from GGUF metadata or config.json).
`EngineConfig` holds the user's knobs. Values found at run time (how many KV blocks fit) live in
`CacheConfig`, a separate result object, so nothing here is mutated after start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULING_MODES = ("continuous", "static")
POLICIES = ("fcfs", "priority")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "cuda")  # auto: the CUDA kernels when on CUDA with CuPy


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # Qwen2 adds a bias to the q, k and v projections
    rope_scaling: dict | None = None  # Llama 3 style {"rope_type": "llama3", "factor": ...}
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"  # "default" (embedded SmolLM2), a .gguf file or a Hugging Face directory
    device: str = "cpu"
    dtype: str = "float32"
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 512  # tokens in one step (prefill chunks + decodes)
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # None: derive from kv_cache_memory_bytes
    kv_cache_memory_bytes: int = 1 << 30  # budget for K and V of all layers
    enable_prefix_caching: bool = True
    scheduling: str = "continuous"  # "continuous" or "static" (the seeds' baseline)
    policy: str = "fcfs"  # "fcfs" or "priority" (lower value first, then arrival)
    num_threads: int | None = None  # torch intra-op threads on CPU; None: leave torch's default
    cpu_linear: str = "onednn"  # float32 CPU matmuls: "onednn" (prepacked weights) or "mkl"
    seed: int = 0  # seeds the shared generator of unseeded requests
    attention_backend: str = "auto"  # "auto", "torch" or "cuda" (see engine/attention.py)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_memory_bytes"):
            _positive(name, getattr(self, name))
        for name in ("max_model_len", "num_kv_blocks", "num_threads"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence needs a token per decode step")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is padding), got {self.num_kv_blocks}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.scheduling not in SCHEDULING_MODES:
            raise ValueError(f"scheduling must be one of {SCHEDULING_MODES}, got {self.scheduling!r}")
        if self.cpu_linear not in ("onednn", "mkl"):
            raise ValueError(f"cpu_linear must be 'onednn' or 'mkl', got {self.cpu_linear!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                             f"got {self.attention_backend!r}")
        if self.attention_backend == "cuda" and not self.device.startswith("cuda"):
            raise ValueError(f"attention_backend 'cuda' needs a CUDA device, got device {self.device!r}")


@dataclass(frozen=True)
class CacheConfig:
    """What the engine found at start-up: the KV cache it actually allocated."""

    block_size: int
    num_kv_blocks: int
    max_model_len: int

    @property
    def num_usable_blocks(self) -> int:
        return self.num_kv_blocks - 1  # block 0 is the padding block, never handed out


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")

