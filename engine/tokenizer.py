"""Tokenizer loading: the same path as the weights (a GGUF file or a Hugging Face directory).

Everything is read from local files (`local_files_only=True`): nothing is ever downloaded.
For GGUF, transformers rebuilds a fast tokenizer, its special tokens and the chat template from
the `tokenizer.ggml.*` and `tokenizer.chat_template` metadata. That conversion takes ~10 s on two
cores, so its result is saved once as a plain tokenizer directory under the cache directory
(`TURNSTILE_CACHE_DIR`, default `~/.cache/turnstile`), keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE_DIR", Path.home() / ".cache" / "turnstile"))


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    path = Path(path)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    saved = cache_dir() / "tokenizers" / key[:16]
    if (saved / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    try:
        partial = saved.with_name(saved.name + f".tmp{os.getpid()}")
        tokenizer.save_pretrained(str(partial))
        partial.rename(saved)  # atomic: a concurrent loader sees all of it or nothing
    except OSError:
        pass  # read-only home or a concurrent writer won: the converted tokenizer still works
    return tokenizer
