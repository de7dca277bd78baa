"""The service tokenizer and the incremental detokenizer against transformers, on SmolLM2's tokenizer.

The reference tokenizer comes from the engine's loader (transformers, GGUF -> cached directory)
and is saved to a temporary directory, which `ServiceTokenizer` then reads without transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.detokenizer import IncrementalDetokenizer
from service.tokenizer import ServiceTokenizer

REPO = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

TEXTS = [
    "Hello, world!",
    "",
    " ",
    "  two leading spaces",
    "tab\tnewline\n\nand\r\nCRLF",
    "héllo wörld, café naïve façade",
    "😀🎉👍🏽 and 👨‍👩‍👧 family",
    "日本語のテキストと中文和한국어",
    "Ünïcödé ÅÄÖ ß ĳ",
    "zero\u200bwidth and \u00a0nbsp",
    "<|im_start|>user\nhi<|im_end|>",
    "x" * 100 + " 🙂",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of Japan? 🗾"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  Tell me a joke.\n"},
    ],
    [{"role": "user", "content": "first", "name": None}, {"role": "tool", "content": '{"ok": true}'}],
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from engine.tokenizer import load_tokenizer
    from engine.weights import resolve_model_path

    return load_tokenizer(resolve_model_path("default"))


@pytest.fixture(scope="module")
def tokenizer_dir(hf_tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    hf_tokenizer.save_pretrained(str(path))  # the same files the engine saves for a GGUF model
    return path


@pytest.fixture(scope="module")
def tok(tokenizer_dir) -> ServiceTokenizer:
    return ServiceTokenizer.from_dir(tokenizer_dir)


def stream(tok, prompt_ids, output_ids, chunks, stop=()):
    """Feeds `output_ids` in pieces of the given sizes (cycled); returns (deltas, flushed, detok)."""
    detok = IncrementalDetokenizer(tok, prompt_ids, stop)
    deltas, i, k = [], 0, 0
    while i < len(output_ids):
        n = chunks[k % len(chunks)]
        deltas.append(detok.add_tokens(output_ids[i : i + n]))
        i, k = i + n, k + 1
    return deltas, detok.flush(), detok


def first_stop_cut(text: str, stop: list[str]) -> str:
    """The reference semantics: cut before the stop string that is complete first (then longest)."""
    matches = [(i + len(s), i) for s in stop if (i := text.find(s)) >= 0]
    return text[: min(matches)[1]] if matches else text


# ---- tokenizer versus transformers --------------------------------------------------------------


def test_attributes_match_transformers(tok, hf_tokenizer):
    assert tok.vocab_size == len(hf_tokenizer) == 49152
    assert tok.eos_token_id == hf_tokenizer.eos_token_id == 2
    assert tok.bos_token_id == hf_tokenizer.bos_token_id == 1
    assert tok.special_tokens == hf_tokenizer.special_tokens_map
    assert tok.special_token_ids == frozenset(range(17))
    assert tok.special_token_ids == {i for i, t in hf_tokenizer.added_tokens_decoder.items() if t.special}


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok, hf_tokenizer, text):
    ids = hf_tokenizer.encode(text, add_special_tokens=True)
    assert tok.encode(text) == ids
    assert tok.encode(text, add_special_tokens=False) == hf_tokenizer.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids, skip_special_tokens=False)


def test_decode_skips_special_tokens(tok):
    assert tok.decode([1, 28120, 2, 0, 5]) == "hello"
    assert tok.decode([1, 28120, 2], skip_special_tokens=False) == "<|im_start|>hello<|im_end|>"


@pytest.mark.parametrize("chat", CHATS)
def test_chat_template_matches_transformers(tok, hf_tokenizer, chat):
    expected = hf_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(chat) == expected
    assert tok.apply_chat_template(chat, add_generation_prompt=False) == hf_tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=False
    )


def test_chat_template_environment_matches_transformers(tok, hf_tokenizer, tokenizer_dir, tmp_path):
    # tojson without HTML escaping, namespace, loop controls, {% generation %}, trim/lstrip blocks.
    template = (
        "{% set ns = namespace(n=0) %}\n"
        "{% for m in messages %}\n"
        "  {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "  {% set ns.n = ns.n + 1 %}\n"
        "{{ bos_token }}{{ ns.n }}:{{ m | tojson }}\n"
        "  {% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}\n"
        "{% endfor %}\n"
        "{{ dict(a=1) | tojson }}{% if add_generation_prompt %}<go>{% endif %}{{ unk_token }}"
    )
    (tmp_path / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "unused"}))
    (tmp_path / "chat_template.jinja").write_text(template)  # the file wins over the config's entry
    custom = ServiceTokenizer.from_dir(tmp_path)
    chat = [
        {"role": "user", "content": "<b>ü & \"q\"</b>"},
        {"role": "skip", "content": "x"},
        {"role": "assistant", "content": "sure"},
    ]
    expected = hf_tokenizer.apply_chat_template(
        chat, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert custom.apply_chat_template(chat) == expected
    assert expected.startswith('<|im_start|>1:{"role": "user", "content": "<b>ü & \\"q\\"</b>"}')


def test_bad_chat_input_raises_value_error(tok, tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="messages is empty"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match=r"messages\[1\]\.role must be a non-empty string, got 3"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\.content must be a string"):
        tok.apply_chat_template([{"role": "user", "content": 5}])
    with pytest.raises(ValueError, match=r"messages\[0\] must be a mapping"):
        tok.apply_chat_template(["hello"])
    (tmp_path / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}"
        "{% endif %}{{ messages[0]['content'] + 1 }}"
    )
    raising = ServiceTokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="chat template failed: first message must be from the user"):
        raising.apply_chat_template([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match="chat template failed: TypeError"):
        raising.apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="chat template does not parse"):
        ServiceTokenizer.from_dir(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="no chat template"):
        ServiceTokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_service_modules_import_neither_torch_nor_transformers():
    code = (
        "import sys, service.tokenizer, service.detokenizer, service.chat_template; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout == "[]\n"


# ---- incremental detokenization -----------------------------------------------------------------


def test_multibyte_character_is_held_until_complete(tok):
    # " 😀" is two byte-level tokens; the first alone is half a character.
    ids = tok.encode(" 😀!")
    assert len(ids) == 3 and tok.decode(ids[:1]) == " \ufffd"
    deltas, flushed, _ = stream(tok, tok.encode("Say"), ids, [1])
    assert deltas == ["", " 😀", "!"] and flushed == ""


def test_incomplete_character_at_the_end_is_flushed(tok):
    ids = tok.encode("ab 😀")[:-1]
    deltas, flushed, _ = stream(tok, [], ids, [1])
    assert "".join(deltas) == "ab" and flushed == " \ufffd"


def test_prompt_ending_inside_a_character_gives_no_context(tok):
    # A token-id prompt may stop halfway through " 😀"; the output's first byte must not join it.
    half, rest = tok.encode(" 😀")
    deltas, flushed, _ = stream(tok, tok.encode("Say") + [half], [rest] + tok.encode("!"), [1])
    assert deltas == ["", "\ufffd!"] and flushed == ""
    assert "".join(deltas) == tok.decode([rest] + tok.encode("!"))


def test_special_tokens_are_skipped(tok):
    ids = [28120, 2, 1] + tok.encode(" world") + [0]
    deltas, flushed, _ = stream(tok, [1], ids, [1])
    assert deltas == ["hello", "", "", " world", ""] and flushed == ""


@FAST
@given(
    ids=st.lists(st.integers(0, 49151), max_size=40),
    prompt=st.lists(st.integers(0, 49151), max_size=8),
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=5),
)
def test_random_ids_concatenate_to_full_decode(tok, ids, prompt, chunks):
    deltas, flushed, _ = stream(tok, prompt, ids, chunks)
    assert "".join(deltas) + flushed == tok.decode(ids)


ALPHABET = st.sampled_from(list("abc XYZ.,\n") + list("éüñçß") + list("日本語中文한") + list("😀🎉👍🏽🇫🇷"))


@FAST
@given(text=st.text(ALPHABET, max_size=40), chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_real_text_streams_whole_characters(tok, text, chunks):
    ids = tok.encode(text)
    deltas, flushed, _ = stream(tok, tok.encode("Reply:"), ids, chunks)
    assert "".join(deltas) + flushed == text
    assert all("\ufffd" not in d for d in deltas) and "\ufffd" not in flushed


# ---- stop strings -------------------------------------------------------------------------------


def test_stop_string_cuts_exactly(tok):
    ids = tok.encode("Hello world. The end.")
    deltas, flushed, detok = stream(tok, [], ids, [1], stop=["world"])
    assert "".join(deltas) == "Hello " and flushed == ""
    assert detok.stop_hit and detok.stop_string == "world"
    assert detok.add_tokens(tok.encode(" more")) == ""


def test_stop_string_across_token_boundaries(tok):
    ids = tok.encode("Hello world")
    assert tok.decode(ids[:1]) == "Hello"
    deltas, flushed, detok = stream(tok, [], ids, [1], stop=["lo wor"])
    assert deltas == ["Hel", ""] and flushed == "" and detok.stop_hit


def test_stop_string_at_the_very_start(tok):
    deltas, flushed, detok = stream(tok, [], tok.encode("Hello world"), [1], stop=["Hello"])
    assert deltas == ["", ""] and flushed == "" and detok.stop_hit


def test_two_stop_strings_earliest_wins(tok):
    ids = tok.encode("one two three four")
    for chunks in ([1], [len(ids)]):
        deltas, _, detok = stream(tok, [], ids, chunks, stop=["four", "two"])
        assert "".join(deltas) == "one " and detok.stop_string == "two"
    # Overlapping: "bc" is complete before "abcd" is, whatever the grouping of tokens.
    ids = tok.encode("xabcd")
    for chunks in ([1], [len(ids)]):
        deltas, _, detok = stream(tok, [], ids, chunks, stop=["abcd", "bc"])
        assert "".join(deltas) == "xa" and detok.stop_string == "bc"


def test_stop_string_that_never_appears(tok):
    text = "The quick brown fox 🦊 jumps."
    deltas, flushed, detok = stream(tok, [], tok.encode(text), [1], stop=["fax", "jumps!"])
    assert "".join(deltas) + flushed == text and not detok.stop_hit and detok.stop_string is None
    assert flushed == ""  # "." cannot start either stop string, so nothing was held


def test_partial_stop_string_is_held_then_flushed(tok):
    ids = tok.encode("Say Hello")
    deltas, flushed, detok = stream(tok, [], ids, [1], stop=["Hello!"])
    assert deltas == ["Say", " "] and flushed == "Hello" and not detok.stop_hit


def test_hold_back_is_at_most_longest_stop_minus_one(tok):
    detok = IncrementalDetokenizer(tok, [], ["abcdef", "zz"])
    assert detok.add_tokens(tok.encode("xyabcde")) == "xy"
    assert detok.add_tokens(tok.encode("z")) == "abcde"  # "abcdez" rules out "abcdef"; "z" may start "zz"
    assert detok.flush() == "z"


@FAST
@given(
    text=st.text(ALPHABET, max_size=30),
    cuts=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 4)), max_size=2),
    others=st.lists(st.text(ALPHABET, min_size=1, max_size=3), max_size=2),
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
)
def test_stop_strings_cut_like_the_reference(tok, text, cuts, others, chunks):
    # Stop strings taken from the text itself (so they do hit) plus random ones (which may not).
    stop = [s for i, n in cuts if (s := text[i : i + n])] + others
    if not stop:
        stop = ["."]
    deltas, flushed, detok = stream(tok, [], tok.encode(text), chunks, stop=stop)
    assert "".join(deltas) + flushed == first_stop_cut(text, stop)
    assert detok.stop_hit == any(s in text for s in stop)
    assert all("\ufffd" not in d for d in deltas) and "\ufffd" not in flushed
