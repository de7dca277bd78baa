"""Incremental detokenization with stop strings, one `IncrementalDetokenizer` per request.

Token ids arrive a few at a time; the client must get text deltas that never split a character
and never show text past a stop string.

Decoding (the vLLM / TGI scheme). Only a small window of ids is decoded per step:

    ids:  ... prompt ... | out0 out1 out2 out3 out4
                   ^prefix_offset   ^read_offset   ^len(ids)
    prefix_text = decode(ids[prefix_offset:read_offset])   text the client already has
    new_text    = decode(ids[prefix_offset:])              the same plus the new tokens
    delta       = new_text[len(prefix_text):]

The window starts a few tokens back so that a token that depends on its left neighbour (a
SentencePiece word start, bytes of one character) decodes as it does in the full text. While
`new_text` ends in U+FFFD, the last character's bytes are not all there: nothing is emitted and
the offsets stay put, so the window grows until the character is complete. After an emission
`read_offset` lies on a character boundary, which is why the deltas concatenate to
`decode(output ids)` for byte-level tokenizers (SmolLM2, Llama 3, Qwen2). A SentencePiece-style
decoder strips the leading space of the text it decodes; the prompt context keeps the space
before the first output word, which `decode(output ids)` alone would drop (vLLM does the same).

Stop strings. Text that could still become a stop string is held back:

    emitted | held (longest suffix that is a proper prefix of some stop string) | next delta

An occurrence of a stop string always starts inside `held + delta`, so each step searches only
that (at most len(longest stop) - 1 + len(delta) characters). On a match the text before the
stop string is returned, `stop_hit` is set, and nothing after it is ever returned.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.tokenizer import ServiceTokenizer

# How many prompt tokens start the first window (vLLM uses 5).
PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Text deltas for one request: `add_tokens` per engine step, `flush` when it finishes."""

    def __init__(self, tokenizer: ServiceTokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()):
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError("stop strings must be non-empty strings")
        self._tokenizer = tokenizer
        self.stop = list(stop)
        self.stop_hit = False
        self.stop_string: str | None = None  # which stop string matched
        # Window of ids: a few prompt tokens for context, then the output. A prompt that ends inside
        # a character (possible for prompts given as token ids) gives no context: its dangling
        # bytes must not merge with the output's.
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        if tokenizer.decode(context).endswith(REPLACEMENT_CHAR):
            context = []
        self._ids = context  # ids[prefix_offset:]: older ids are never needed again
        self._read_offset = len(context)  # relative to prefix_offset
        self._held = ""  # decoded text not yet returned because it may start a stop string

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """The text that `token_ids` make safe to show; "" once a stop string has matched."""
        if self.stop_hit:
            return ""
        self._ids.extend(token_ids)
        prefix_text = self._tokenizer.decode(self._ids[: self._read_offset])
        new_text = self._tokenizer.decode(self._ids)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # only special tokens so far, or a character still incomplete
        # prefix_offset = read_offset; read_offset = len(ids): the work stays O(window), not O(n).
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        return self._check_stop(new_text[len(prefix_text) :])

    def flush(self) -> str:
        """At the end of generation: everything still held back, including a character whose
        last bytes never came (as U+FFFD, like `decode`)."""
        if self.stop_hit:
            return ""
        prefix_text = self._tokenizer.decode(self._ids[: self._read_offset])
        new_text = self._tokenizer.decode(self._ids)
        self._ids, self._read_offset = [], 0
        text = self._check_stop(new_text[len(prefix_text) :])
        if not self.stop_hit:
            text, self._held = text + self._held, ""
        return text

    def _check_stop(self, delta: str) -> str:
        """Returns the part of `held + delta` that can no longer be (part of) a stop string."""
        text = self._held + delta
        if not self.stop:
            self._held = ""
            return text
        # The first stop string to be complete wins (then the longest): the cut is the same however
        # the tokens were grouped into steps.
        matches = [(i + len(s), i, s) for s in self.stop if (i := text.find(s)) >= 0]
        if matches:
            _, start, self.stop_string = min(matches)
            self.stop_hit, self._held = True, ""
            return text[:start]
        keep = self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
