"""Fixtures shared by every test layer: the offline engine on SmolLM2 (loaded once per session)."""

import pytest

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
def llm():
    from engine import LLM
    from engine.weights import DEFAULT_MODEL

    return LLM(model=DEFAULT_MODEL, device="cpu", dtype="float32", max_num_seqs=32)


@pytest.fixture(scope="session")
def chat_prompts(llm):
    return [llm.chat_prompt([{"role": "user", "content": c}]) for c in CHATS]
