"""Shared, session-scoped models: loading SmolLM2 costs seconds, so each is loaded once."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM
from engine.weights import DEFAULT_MODEL, resolve_model_path

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one paragraph.",
    "List three prime numbers and say why they are prime.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning' into Spanish and French.",
]


@pytest.fixture(scope="session")
def hf_model():
    """Hugging Face transformers on the same GGUF weights: the golden reference."""
    path = resolve_model_path(DEFAULT_MODEL)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True)
    return model.eval()


@pytest.fixture(scope="session")
def llm():
    return LLM(model=DEFAULT_MODEL, device="cpu", dtype="float32", max_num_seqs=32)


@pytest.fixture(scope="session")
def chat_prompts(llm):
    return [llm.chat_prompt([{"role": "user", "content": c}]) for c in CHATS]
