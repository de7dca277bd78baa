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
import shutil
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE_DIR", Path.home() / ".cache" / "turnstile"))


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(str(tokenizer_dir(path)), local_files_only=True)


def tokenizer_dir(path: Path) -> Path:
    """A tokenizer directory for the model at `path`, saved by transformers once per model version.

    The service loads it with the `tokenizers` library alone, so it never needs transformers. Both
    GGUF files and Hugging Face directories go through transformers once: for older tokenizer
    classes (LlamaTokenizerFast) transformers rebuilds the pipeline, and the saved copy records
    exactly what it built.
    """
    path = Path(path)
    if path.is_dir():
        versions = sorted(f"{f.name}:{f.stat().st_mtime_ns}" for f in path.glob("tokenizer*"))
        key_source = f"{path.resolve()}|{versions}"
        load_args = dict(pretrained_model_name_or_path=str(path))
    else:
        stat = path.stat()
        key_source = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        load_args = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name)
    saved = cache_dir() / "tokenizers" / hashlib.sha256(key_source.encode()).hexdigest()[:16]
    if (saved / "tokenizer.json").exists():
        return saved
    tokenizer = AutoTokenizer.from_pretrained(**load_args, local_files_only=True)
    partial = saved.with_name(saved.name + f".tmp{os.getpid()}")
    tokenizer.save_pretrained(str(partial))
    try:
        partial.rename(saved)  # atomic: a concurrent loader sees all of it or nothing
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)  # a concurrent writer won: use its copy
    return saved
