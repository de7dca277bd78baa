"""The service's tokenizer: a Hugging Face tokenizer directory read with `tokenizers` and jinja2.

The front end never imports torch, and `transformers` imports torch, so this module reads the
directory that the engine process saves (`engine/tokenizer.py`) or a Hugging Face model
directory, which hold the same files:

    tokenizer.json            vocabulary, merges, pre/post-processing: `tokenizers.Tokenizer`
    tokenizer_config.json     named special tokens (bos_token, eos_token, ...), maybe chat_template
    special_tokens_map.json   older layout of the special tokens (read when the config lacks them)
    chat_template.jinja       the chat template (takes priority over the config's)

Encoding, decoding and chat rendering match `transformers.AutoTokenizer` (5.x) on the same
directory: the tests compare them token for token and byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from service.chat_template import compile_chat_template, render_chat_template

# The named special tokens transformers passes to chat templates, in its order.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(value) -> str | None:
    """A special token is saved as a string or as a serialized AddedToken {"content": ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _named_special_tokens(path: Path, config: dict) -> dict[str, str]:
    extra = config.get("extra_special_tokens")
    extra = extra if isinstance(extra, Mapping) else {}  # model-specific named tokens ("image_token")
    names = list(SPECIAL_TOKEN_NAMES) + [k for k in extra if k not in SPECIAL_TOKEN_NAMES]
    values = {name: config.get(name, extra.get(name)) for name in names}
    if "added_tokens_decoder" not in config:  # legacy layout: the separate map wins, as in transformers
        for name, value in _read_json(path / "special_tokens_map.json").items():
            if name in names and value is not None:
                values[name] = value
    return {name: text for name, value in values.items() if (text := _token_text(value)) is not None}


def _chat_template_source(path: Path, config: dict) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.exists():
        return jinja_file.read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, list):  # several named templates: [{"name": ..., "template": ...}]
        source = {t["name"]: t["template"] for t in source}.get("default")
    return source if isinstance(source, str) else None


class ServiceTokenizer:
    """Encode, decode and chat-render for one model; immutable after `from_dir`, safe to share."""

    def __init__(self, tokenizer: Tokenizer, special_tokens: Mapping[str, str], chat_template: str | None):
        # Named special tokens missing from the vocabulary are added as special tokens, as transformers does.
        missing = [t for t in special_tokens.values() if tokenizer.token_to_id(t) is None]
        if missing:
            tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
        self._tokenizer = tokenizer
        self.special_tokens: dict[str, str] = dict(special_tokens)  # {"bos_token": "<s>", ...}
        # Every id a tokenizer can decode, added tokens included (like `len(AutoTokenizer)`).
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = self._id_of("bos_token")
        self.eos_token_id: int | None = self._id_of("eos_token")
        self.pad_token_id: int | None = self._id_of("pad_token")
        # The ids `decode(..., skip_special_tokens=True)` drops: every added token marked special.
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        )
        self.chat_template: str | None = chat_template
        self._template = compile_chat_template(chat_template) if chat_template is not None else None

    @classmethod
    def from_dir(cls, path: str | Path) -> ServiceTokenizer:
        """Loads a tokenizer directory; FileNotFoundError without tokenizer.json, ValueError when
        the chat template does not parse."""
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.exists():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        config = _read_json(path / "tokenizer_config.json")
        return cls(
            Tokenizer.from_file(str(tokenizer_file)),
            _named_special_tokens(path, config),
            _chat_template_source(path, config),
        )

    def _id_of(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self._tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; the post-processor in tokenizer.json adds BOS/EOS where the model
        wants them. Use add_special_tokens=False for a rendered chat (the template wrote them)."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `token_ids`; a character whose bytes are cut off decodes to U+FFFD."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation ([{"role": ..., "content": ...}, ...]); ValueError when
        the model has no chat template, the messages are malformed or the template raises."""
        if self._template is None:
            raise ValueError("this model has no chat template; send a text prompt instead")
        return render_chat_template(self._template, messages, self.special_tokens, add_generation_prompt)
