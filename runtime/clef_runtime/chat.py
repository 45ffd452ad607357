"""A checkpoint's tokenizer and chat template, as the serving engines apply them.

Engines render a chat request with the checkpoint's own Jinja template (``chat_template.jinja``,
or ``chat_template`` in ``tokenizer_config.json``), with ``add_generation_prompt`` and, for
Qwen-style templates, the thinking switch (``enable_thinking``), then tokenize the text without
adding special tokens (the template already wrote them).  Goldens and `clef-runtime serve` render
here, so both agree with the engines by construction, and a server whose template differs shows
up as a different prompt length.

The template runs in a sandboxed Jinja environment configured the way Hugging Face's tokenizers
render templates (blocks trimmed, ``loopcontrols``, a ``tojson`` filter, ``raise_exception``);
templates written for them render the same text here.

Imports neither torch nor Triton: `endpoint-check` runs on CPU-only hosts with this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"

Message = Mapping[str, str]


class ChatError(ValueError):
    """A checkpoint without a usable tokenizer or template, or a template that refused a request."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ChatError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ChatError(f"{path}: must hold a JSON object")
    return raw


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_text(directory: Path, config: Mapping[str, Any]) -> str:
    path = directory / TEMPLATE_FILE
    if path.is_file():
        return path.read_text()
    raw = config.get("chat_template")
    if isinstance(raw, list):  # named templates: the engines use "default"
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        raw = named.get("default")
    if not isinstance(raw, str) or not raw.strip():
        raise ChatError(
            f"{directory}: no chat template ({TEMPLATE_FILE}, or chat_template in {TOKENIZER_CONFIG})"
        )
    return raw


def checkpoint_text_files(directory: str | Path) -> list[Path]:
    """The files besides the weights that decide what a prompt becomes and when generation stops:
    part of the checkpoint digest."""
    d = Path(directory)
    names = ("config.json", TOKENIZER_FILE, TOKENIZER_CONFIG, TEMPLATE_FILE, GENERATION_CONFIG)
    return [d / n for n in names if (d / n).is_file()]


def _stop_ids(directory: Path, eos_id: int | None) -> tuple[int, ...]:
    raw = _read_json(directory / GENERATION_CONFIG).get("eos_token_id")
    ids = raw if isinstance(raw, list) else [raw] if raw is not None else []
    if eos_id is not None:
        ids.append(eos_id)
    return tuple(sorted({i for i in ids if isinstance(i, int) and not isinstance(i, bool)}))


def _environment() -> Any:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@dataclass
class ChatTokenizer:
    """Render, encode and decode as the engines do for one checkpoint."""

    directory: Path
    template: str
    special: dict[str, str]  # bos_token, eos_token, pad_token, ... as the template sees them
    stop_ids: tuple[int, ...]  # generation ends after one of these (generation_config + eos)
    _tokenizer: Any
    _compiled: Any

    @classmethod
    def from_dir(cls, directory: str | Path, *, template: str | None = None) -> ChatTokenizer:
        """Load ``tokenizer.json`` and the chat template of a checkpoint directory; ``template``
        replaces the checkpoint's (as an engine's ``--chat-template`` does)."""
        from tokenizers import Tokenizer

        d = Path(directory)
        if not (d / TOKENIZER_FILE).is_file():
            raise ChatError(f"{d}: no {TOKENIZER_FILE} (a fast tokenizer file is required)")
        tokenizer = Tokenizer.from_file(str(d / TOKENIZER_FILE))
        config = _read_json(d / TOKENIZER_CONFIG)
        text = template if template is not None else _template_text(d, config)
        special = {
            key: tok
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (tok := _token_text(config.get(key))) is not None
        }
        eos = special.get("eos_token")
        eos_id = tokenizer.token_to_id(eos) if eos is not None else None
        env = _environment()
        try:
            compiled = env.from_string(text)
        except Exception as exc:
            raise ChatError(f"{d}: the chat template does not compile: {exc}") from None
        return cls(d, text, special, _stop_ids(d, eos_id), tokenizer, compiled)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def render(
        self,
        messages: Sequence[Message],
        *,
        enable_thinking: bool = False,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of a conversation, ready for the assistant's turn."""
        try:
            return str(
                self._compiled.render(
                    messages=[dict(m) for m in messages],
                    add_generation_prompt=add_generation_prompt,
                    enable_thinking=enable_thinking,
                    **self.special,
                )
            )
        except Exception as exc:
            raise ChatError(f"the chat template refused the conversation: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def chat_ids(self, messages: Sequence[Message], *, enable_thinking: bool = False) -> list[int]:
        return self.encode(self.render(messages, enable_thinking=enable_thinking))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def piece(self, token_id: int) -> str:
        """One token's text (as `decode` writes it alone; may be a partial UTF-8 sequence)."""
        return self.decode([token_id])
