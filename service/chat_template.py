"""Chat templates rendered the way Hugging Face `transformers` renders them, without transformers.

A chat template is untrusted Jinja code shipped with the model. It runs in jinja2's
`ImmutableSandboxedEnvironment` with the environment transformers builds (5.x,
`utils/chat_template_utils.py`): `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension, a
no-op `{% generation %}` tag, `raise_exception`, `strftime_now`, a `tojson` filter that does not
escape HTML, and the restricted `dict` and `namespace` globals. The template sees `messages`,
`tools=None`, `documents=None`, `add_generation_prompt` and the named special tokens
(`bos_token`, `eos_token`, ...), so the rendered prompt is byte-identical to
`AutoTokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Fields that hold a message's reasoning; transformers copies the first present one into
# `reasoning_content` (what most templates read) and `thinking` (what gpt-oss templates read).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; here it
    renders its body unchanged (transformers does the same unless it is asked for a mask)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class _TemplateDict:
    """`dict(...)` inside templates, without exposing the `dict` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (no reach into internals)."""

    def __init__(*args, **kwargs):  # Jinja's signature trick, so `namespace(self=...)` still works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def compile_chat_template(source: str) -> jinja2.Template:
    """Raises ValueError when the template does not parse."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template does not parse: {e.message} (line {e.lineno})") from e


def _plain(value, where: str):
    """A fresh copy made of JSON types only: templates never see (or mutate) the caller's objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, where) for v in value)
    raise ValueError(f"{where}: {type(value).__name__} is not a JSON value")


def normalize_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Checks a conversation and prepares it as transformers does: None-valued keys are dropped and
    reasoning fields are aliased. Raises ValueError naming the offending message."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of messages, got {type(messages).__name__}")
    if len(messages) == 0:
        raise ValueError("messages is empty: a chat needs at least one message")
    normalized = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be a mapping with 'role' and 'content', got {type(message).__name__}")
        message = {k: v for k, v in message.items() if v is not None}
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"{where}.role must be a non-empty string, got {role!r}")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"{where}.content must be a string or a list of parts, got {type(content).__name__}")
        message = _plain(message, where)
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        normalized.append(message)
    return normalized


def render_chat_template(
    template: jinja2.Template,
    messages: Sequence[Mapping],
    special_tokens: Mapping[str, str],
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for `messages`; ValueError when the input is bad or the template raises."""
    chat = normalize_messages(messages)
    try:
        return template.render(
            messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **special_tokens
        )
    except jinja2.TemplateError as e:  # raise_exception(), undefined values, sandbox refusals
        raise ValueError(f"chat template failed: {e.message or type(e).__name__}") from e
    except Exception as e:  # the template's own expressions on this input, e.g. "text" + a list
        raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from e
