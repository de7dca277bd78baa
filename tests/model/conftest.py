"""Shared, session-scoped models: loading SmolLM2 costs seconds, so each is loaded once."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.weights import DEFAULT_MODEL, resolve_model_path


@pytest.fixture(scope="session")
def hf_model():
    """Hugging Face transformers on the same GGUF weights: the golden reference."""
    path = resolve_model_path(DEFAULT_MODEL)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True)
    return model.eval()
