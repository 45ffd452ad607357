"""The prompt set: the built-in one that exercises the GDN failure surface, and users' own.

The built-in set aims at rendered prompt lengths (after the chat template, thinking off) where GDN
kernels break: 1 token (no chunk at all), 63, 64 and 65 (one short of, exactly, and one past the
64-token chunk), 1001 (many chunks and a ragged tail), 8197 (≥ 8192, a long state history, not a
multiple of 64), plus two ordinary questions.  64 to 96 new tokens each, 576 in all (≥ 420
compared tokens, the homelab's own check's size), unless a prompt ends at a stop token first.

The long prompts are a numbered list ("Line 17: 17 squared is 289.") that a model continues
confidently, so a healthy engine seldom meets a near-tie on them.  A target length is hit by
adding list lines, then single filler words, to the user turn; when a tokenizer cannot hit it
exactly, the nearest length below is used and the file records the real one.

A user's prompt file (``--prompts``) is JSON: ``{"prompts": [{"name": "...", "text": "..."} |
{"name": "...", "tokenIds": [...]}, ...]}`` with an optional ``"maxNewTokens"`` per prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_runtime.chat import ChatTokenizer, rust_trim, templates
from clef_runtime.goldens.schema import GoldensError, PromptSpec

DEFAULT_NEW_TOKENS = 64
MAX_USER_PROMPTS = 64


@dataclass(frozen=True)
class Target:
    name: str
    tokens: int  # rendered prompt length to aim at


TARGETS = (Target("chat-63", 63), Target("chat-64", 64), Target("chat-65", 65), Target("chat-1001", 1001))
LONG = Target("chat-8197", 8197)
QUESTIONS = (
    ("question-planets", "Name the planets of the solar system in order, one per line, with one fact each."),
    (
        "question-code",
        "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test.",
    ),
)
_INSTRUCTION = "Continue this list in exactly the same style for as long as you can."
_FILLER = " yes"


def _list_text(lines: int, extra_words: int) -> str:
    body = "\n".join(f"Line {i}: {i} squared is {i * i}." for i in range(1, lines + 1))
    return _INSTRUCTION + "\n" + body + _FILLER * extra_words


def _fit(length: Callable[[str], int], target: int) -> str:
    """The user text whose rendered length is `target`, or the longest below it."""
    lo, hi = 0, 1
    while length(_list_text(hi, 0)) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # length(lines=lo) <= target < length(lines=hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if length(_list_text(mid, 0)) <= target else (lo, mid)
    best = _list_text(lo, 0)
    words = 0
    while length(best) < target:
        candidate = _list_text(lo, words + 1)
        if length(candidate) > target:
            break
        best, words = candidate, words + 1
    return best


def builtin_prompts(tok: ChatTokenizer, *, long: bool = True) -> list[PromptSpec]:
    """The built-in set for a checkpoint's tokenizer; `long=False` leaves out the 8197-token one."""

    def length(text: str) -> int:
        return len(tok.chat_ids([{"role": "user", "content": text}]))

    first = tok.encode("The")
    specs = [PromptSpec("tokens-1", "tokens", "", (first[0],), DEFAULT_NEW_TOKENS)]
    for target in (*TARGETS, *((LONG,) if long else ())):
        text = _fit(length, target.tokens)
        specs.append(chat_spec(tok, target.name, text, DEFAULT_NEW_TOKENS))
    specs += [chat_spec(tok, name, text, 96) for name, text in QUESTIONS]
    return specs


def chat_spec(
    tok: ChatTokenizer, name: str, text: str, max_new_tokens: int, field: str | None = None
) -> PromptSpec:
    """A chat prompt's golden ids, refused when an engine would render it otherwise (`field`
    names it in the error: the prompt file's ``prompts[i].text``)."""
    where = field or f"prompt {name}"
    if rust_trim(text) != text:
        raise GoldensError(
            f"{where}: leading or trailing whitespace ({text[:1]!r}...{text[-1:]!r}): candle-vllm trims "
            "message content before templating, so it would be asked another prompt; remove it"
        )
    rendered = tok.render([{"role": "user", "content": text}], enable_thinking=False)
    ids = tok.encode(rendered)
    if tok.encode(rendered, add_special_tokens=True) != ids:
        raise GoldensError(
            f"{where}: the tokenizer adds special tokens when encoding (tokenizer.json's post_processor): "
            "candle-vllm encodes the rendered prompt with them, vLLM's chat route without, so the "
            "engines would be asked different ids; use a tokenizer whose post_processor adds none"
        )
    return PromptSpec(name, "chat", text, tuple(ids), max_new_tokens)


def check_templates(tok_dir: Path, config: dict[str, Any]) -> None:
    """Refuse a checkpoint whose two chat templates differ: candle-vllm renders with
    tokenizer_config.json's, vLLM and transformers with chat_template.jinja."""
    found = templates(tok_dir, config)
    if len(found) == 2 and found["jinja"] != found["config"]:
        raise GoldensError(
            f"{tok_dir}: chat_template.jinja and tokenizer_config.json's chat_template differ: "
            "candle-vllm renders with tokenizer_config.json's, vLLM with chat_template.jinja, so "
            "no goldens can speak for both; make them the same (or keep one)"
        )


def _user_prompt(raw: Any, i: int, tok: ChatTokenizer, default_new: int) -> PromptSpec:
    where = f"prompts[{i}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise GoldensError(f"{where} must be an object with a non-empty name")
    new = raw.get("maxNewTokens", default_new)
    if isinstance(new, bool) or not isinstance(new, int) or not 1 <= new <= 4096:
        raise GoldensError(f"{where}.maxNewTokens must be an integer in [1, 4096]")
    if isinstance(raw.get("text"), str) and raw["text"]:
        return chat_spec(tok, raw["name"], raw["text"], new, field=f"{where}.text")
    ids = raw.get("tokenIds")
    if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return PromptSpec(raw["name"], "tokens", "", tuple(ids), new)
    raise GoldensError(f"{where} needs a non-empty text or a non-empty list of tokenIds")


def user_prompts(
    path: str | Path, tok: ChatTokenizer, default_new: int = DEFAULT_NEW_TOKENS
) -> list[PromptSpec]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise GoldensError(f"{path}: cannot read the prompt file ({exc})") from None
    return parse_user_prompts(text, str(path), tok, default_new)


def parse_user_prompts(
    text: str, path: str, tok: ChatTokenizer, default_new: int = DEFAULT_NEW_TOKENS
) -> list[PromptSpec]:
    """The prompts of a prompt file's text (`path` names it in errors: a file, or --prompts-json)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GoldensError(f"{path}: cannot read the prompt file ({exc})") from None
    items = raw.get("prompts") if isinstance(raw, dict) else None
    if not isinstance(items, list) or not items or len(items) > MAX_USER_PROMPTS:
        raise GoldensError(f"{path}: needs a 'prompts' list of 1 to {MAX_USER_PROMPTS} prompts")
    return [_user_prompt(p, i, tok, default_new) for i, p in enumerate(items)]


def check_prompts(specs: Sequence[PromptSpec], vocab_size: int, max_positions: int) -> None:
    names = [s.name for s in specs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise GoldensError(f"prompt names must be unique: {', '.join(duplicated)}")
    for s in specs:
        if any(not 0 <= t < vocab_size for t in s.prompt_ids):
            raise GoldensError(f"prompt {s.name}: token ids must be in [0, {vocab_size})")
        if len(s.prompt_ids) + s.max_new_tokens > max_positions:
            raise GoldensError(
                f"prompt {s.name}: {len(s.prompt_ids)} + {s.max_new_tokens} tokens exceed "
                f"max_position_embeddings {max_positions}"
            )
