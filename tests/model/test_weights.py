"""engine/weights.py against transformers: same names, same values, same config.

The embedded GGUF is compared with transformers' own GGUF loader; small checkpoints written into
tmp_path (safetensors directories and GGUF files) must round-trip exactly. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.weights import DEFAULT_MODEL, load_model_config, load_weights, resolve_model_path

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.fixture(scope="module")
def embedded(hf_model):
    path = resolve_model_path(DEFAULT_MODEL)
    config = load_model_config(path)
    ours = load_weights(path, config)
    return path, config, ours, hf_model


def test_embedded_weights_equal_transformers(embedded):
    path, config, ours, hf = embedded
    reference = hf.state_dict()
    assert path.suffix == ".gguf" and config.num_hidden_layers == 30
    assert "lm_head.weight" not in ours  # SmolLM2 ties its head to the embedding
    assert set(ours) == set(reference) - {"lm_head.weight"}
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and tensor.is_contiguous(), name
        assert torch.equal(tensor, reference[name]), name


def test_embedded_config_matches_transformers(embedded):
    _, config, _, hf = embedded
    c = hf.config
    rope_theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", None))
    assert config.architecture == "LlamaForCausalLM"
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
        c.hidden_size, c.intermediate_size, c.num_hidden_layers)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    assert (config.vocab_size, config.max_position_embeddings) == (c.vocab_size, c.max_position_embeddings)
    assert config.rope_theta == rope_theta and config.rms_norm_eps == c.rms_norm_eps
    assert config.tie_word_embeddings == c.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))  # <|im_start|>, <|im_end|>
    assert config.rope_scaling is None and not config.attention_bias


# ---------------------------------------------------------------------------------------------
# Hugging Face directories written by the test


def _save(model, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


def test_llama_directory_round_trips(tmp_path):
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False, rope_parameters=rope,
                                         bos_token_id=1, eos_token_id=[2, 3]))
    path = _save(model, tmp_path / "llama")
    config = load_model_config(path)
    assert (config.architecture, config.head_dim, config.rope_theta) == ("LlamaForCausalLM", 8, 500000.0)
    assert config.rope_scaling["rope_type"] == "llama3" and config.rope_scaling["factor"] == 8.0
    assert "rope_theta" not in config.rope_scaling
    assert not config.tie_word_embeddings and not config.attention_bias
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2, 3))
    _assert_equal(load_weights(path, config), model.state_dict())


def test_qwen2_directory_with_bias_round_trips(tmp_path):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True))
    path = _save(model, tmp_path / "qwen2")
    config = load_model_config(path)
    assert config.architecture == "Qwen2ForCausalLM" and config.attention_bias and config.tie_word_embeddings
    ours = load_weights(path, config)
    assert "model.layers.1.self_attn.k_proj.bias" in ours and "lm_head.weight" not in ours
    _assert_equal(ours, model.state_dict())


def _assert_equal(ours: dict, reference: dict) -> None:
    assert set(ours) == set(reference) - ({"lm_head.weight"} if "lm_head.weight" not in ours else set())
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, reference[name]), name


# ---------------------------------------------------------------------------------------------
# GGUF files written by the test, with llama.cpp's Q/K permutation


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rotate_half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: Path, arch: str, model) -> Path:
    c = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_eos_token_id(2)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm", "o_proj": "attn_output", "q_proj": "attn_q",
             "k_proj": "attn_k", "v_proj": "attn_v", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
             "down_proj": "ffn_down", "lm_head": "output"}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for a tied head
        parts = [p for p in name.split(".") if p not in ("model", "self_attn", "mlp", "layers")]
        layer = [f"blk.{parts.pop(0)}"] if parts[0].isdigit() else []
        w = tensor.numpy()
        if arch == "llama" and parts[0] in ("q_proj", "k_proj"):
            w = _llama_cpp_permute(w, c.num_attention_heads if parts[0] == "q_proj" else c.num_key_value_heads)
        writer.add_tensor(".".join(layer + [names[parts[0]], parts[1]]), np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_round_trips_through_llama_cpp_layout(tmp_path, arch):
    torch.manual_seed(0)
    if arch == "llama":  # untied head, and Q/K permuted with different head counts
        model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False))
    else:  # tied head, biases, no permutation (llama.cpp runs qwen2 with NeoX RoPE)
        model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True))
    path = _write_gguf(tmp_path / f"{arch}.gguf", arch, model)
    config = load_model_config(path)
    assert config.tie_word_embeddings == (arch == "qwen2") and config.attention_bias == (arch == "qwen2")
    assert (config.vocab_size, config.head_dim, config.eos_token_ids) == (64, 8, (2,))
    _assert_equal(load_weights(path, config), model.state_dict())


# ---------------------------------------------------------------------------------------------
# Errors name the file and, where there is one, the tensor


def test_missing_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        resolve_model_path(str(missing))
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_model_config(missing)


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_config(tmp_path)


def test_unsupported_architecture(tmp_path):
    path = _save(LlamaForCausalLM(LlamaConfig(**TINY)), tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"config\.json.*GPT2LMHeadModel"):
        load_model_config(path)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    gguf_path = _write_gguf(tmp_path / "gpt2.gguf", "gpt2", model)
    with pytest.raises(ValueError, match=r"gpt2\.gguf.*'gpt2'"):
        load_model_config(gguf_path)


def test_wrong_shape_and_missing_tensor(tmp_path):
    model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False))
    path = _save(model, tmp_path / "m")
    config = load_model_config(path)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    name = "model.layers.1.mlp.up_proj.weight"
    state[name] = torch.zeros(3, 5)
    save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"model\.safetensors.*{name}.*\[3, 5\].*\[48, 32\]"):
        load_weights(path, config)
    del state[name]
    save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{path}.*{name} is missing"):
        load_weights(path, config)
