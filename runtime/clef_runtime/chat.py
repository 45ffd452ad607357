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

Engines differ in the details (`Rendering`): vLLM and transformers (`HF`) take
``chat_template.jinja`` first and stop at ``generation_config.json``'s eos ids and the tokenizer's
eos token; candle-vllm (`CANDLE_VLLM`, read from its source at 36fe5d9) trims every message's
content, takes ``tokenizer_config.json``'s template first, adds special tokens when encoding, and
stops at ``config.json``'s eos ids and the tokenizer's eos token.  Goldens (`GOLDENS`) render as
`HF` and stop at the union of every engine's stop set: an engine that stops at fewer tokens goes on
past the golden's end, which is not compared.

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

CONFIG = "config.json"

Message = Mapping[str, str]

# Rust's `char::is_whitespace` (Unicode White_Space): what candle-vllm's `str::trim` removes.
RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)


def rust_trim(text: str) -> str:
    """`text` as Rust's `str::trim` leaves it."""
    return text.strip(RUST_WHITESPACE)


@dataclass(frozen=True)
class Rendering:
    """How one engine turns a chat request into prompt ids, and where it stops generating."""

    template_order: tuple[str, str]  # where the chat template is looked for first: "jinja" | "config"
    trim_content: bool  # each message's content trimmed (Rust's trim) before templating
    add_special_tokens: bool  # the tokenizer's post-processor runs when encoding the rendered text
    stop_sources: tuple[str, ...]  # files whose eos_token_id joins the tokenizer's eos token


HF = Rendering(("jinja", "config"), False, False, (GENERATION_CONFIG,))
CANDLE_VLLM = Rendering(("config", "jinja"), True, True, (CONFIG,))
GOLDENS = Rendering(("jinja", "config"), False, False, (GENERATION_CONFIG, CONFIG))


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


def tokenizer_config(directory: str | Path) -> dict[str, Any]:
    """A checkpoint's tokenizer_config.json ({} when it has none)."""
    return _read_json(Path(directory) / TOKENIZER_CONFIG)


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _config_template(config: Mapping[str, Any]) -> str | None:
    raw = config.get("chat_template")
    if isinstance(raw, list):  # named templates: the engines use "default"
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        raw = named.get("default")
    return raw if isinstance(raw, str) and raw.strip() else None


def templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The chat templates a checkpoint carries: "jinja" (chat_template.jinja) and "config"
    (tokenizer_config.json's chat_template), each where present."""
    path = directory / TEMPLATE_FILE
    found = {"jinja": path.read_text() if path.is_file() else None, "config": _config_template(config)}
    return {k: v for k, v in found.items() if v is not None}


def _template_text(directory: Path, config: Mapping[str, Any], order: Sequence[str]) -> str:
    found = templates(directory, config)
    for source in order:
        if source in found:
            return found[source]
    raise ChatError(
        f"{directory}: no chat template ({TEMPLATE_FILE}, or chat_template in {TOKENIZER_CONFIG})"
    )


def checkpoint_text_files(directory: str | Path) -> list[Path]:
    """The files besides the weights that decide what a prompt becomes and when generation stops:
    part of the checkpoint digest."""
    d = Path(directory)
    names = (CONFIG, TOKENIZER_FILE, TOKENIZER_CONFIG, TEMPLATE_FILE, GENERATION_CONFIG)
    return [d / n for n in names if (d / n).is_file()]


def _eos_ids(path: Path) -> list[Any]:
    """A config file's ``eos_token_id``: one id or a list (config.json may nest it in text_config)."""
    config = _read_json(path)
    raw = config.get("eos_token_id")
    text = config.get("text_config")
    if raw is None and isinstance(text, dict):
        raw = text.get("eos_token_id")
    return raw if isinstance(raw, list) else [raw] if raw is not None else []


def _stop_ids(directory: Path, eos_id: int | None, sources: Sequence[str]) -> tuple[int, ...]:
    ids = [i for name in sources for i in _eos_ids(directory / name)]
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
    stop_ids: tuple[int, ...]  # generation ends after one of these (`Rendering.stop_sources` + eos)
    _tokenizer: Any
    _compiled: Any
    rendering: Rendering = HF

    @classmethod
    def from_dir(
        cls, directory: str | Path, *, template: str | None = None, rendering: Rendering = HF
    ) -> ChatTokenizer:
        """Load ``tokenizer.json`` and the chat template of a checkpoint directory as the engine of
        `rendering` does; ``template`` replaces the checkpoint's (an engine's ``--chat-template``)."""
        from tokenizers import Tokenizer

        d = Path(directory)
        if not (d / TOKENIZER_FILE).is_file():
            raise ChatError(f"{d}: no {TOKENIZER_FILE} (a fast tokenizer file is required)")
        tokenizer = Tokenizer.from_file(str(d / TOKENIZER_FILE))
        config = _read_json(d / TOKENIZER_CONFIG)
        text = template if template is not None else _template_text(d, config, rendering.template_order)
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
        stops = _stop_ids(d, eos_id, rendering.stop_sources)
        return cls(d, text, special, stops, tokenizer, compiled, rendering)

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
        if self.rendering.trim_content:
            messages = [{**m, "content": rust_trim(m["content"])} for m in messages]
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

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def chat_ids(self, messages: Sequence[Message], *, enable_thinking: bool = False) -> list[int]:
        text = self.render(messages, enable_thinking=enable_thinking)
        return self.encode(text, add_special_tokens=self.rendering.add_special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def piece(self, token_id: int) -> str:
        """One token's text (as `decode` writes it alone; may be a partial UTF-8 sequence)."""
        return self.decode([token_id])
