"""Requests `clef-runtime serve` accepts, checked field by field: anything it would not honour
exactly is a 4xx with a message saying which field and why, never a silently different answer.

Only greedy decoding exists here: ``temperature`` may be absent or 0 (an absent one is greedy too,
unlike OpenAI's default of 1, because greedy is all this server does); ``n`` must be 1, ``stream``
false, ``stop`` empty.  vLLM's extensions are understood: ``return_token_ids``,
``return_tokens_as_token_ids``, ``ignore_eos``, ``chat_template_kwargs``; candle-vllm's
``thinking``/``enable_thinking`` too.  ``seed`` is accepted and has no effect (greedy).  The
sampling fields vLLM and candle-vllm read (repetition/presence/frequency penalties, top-k, top-p,
min-p) are accepted at their neutral values only: a penalty this server would not apply is a 400
naming the field, never an answer computed without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_TOP_LOGPROBS = 20
DEFAULT_MAX_TOKENS = 16


class BadRequest(Exception):
    """A request this server will not run: ``status`` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int
    max_new_tokens: int
    max_positions: int
    vocab_size: int


@dataclass(frozen=True)
class Generate:
    """One greedy generation, whichever route asked for it."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    top_logprobs: int | None  # None: no logprobs asked; 0: the chosen token's only
    return_token_ids: bool
    tokens_as_ids: bool
    ignore_eos: bool


def _int(body: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(400, f"{key} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(400, f"{key} must be true or false, got {value!r}")
    return value


# field -> the values that leave greedy decoding alone (vLLM's and candle-vllm's spellings).
NEUTRAL: Mapping[str, tuple[float, ...]] = {
    "repetition_penalty": (1.0,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "top_k": (-1, 0),
    "top_p": (1.0,),
    "min_p": (0.0,),
    "dry_multiplier": (0.0,),  # mistral.rs's DRY repetition penalty
}


def _neutral_sampling(body: Mapping[str, Any]) -> None:
    for key, neutral in NEUTRAL.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value not in neutral:
            said = " or ".join(f"{v:g}" for v in neutral)
            raise BadRequest(
                400, f"{key} must be {said} (neutral): this server decodes greedily only (got {value!r})"
            )
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(400, f"seed must be an integer, got {seed!r}")


def _greedy_only(body: Mapping[str, Any]) -> None:
    _neutral_sampling(body)
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature > 1e-7
    ):
        raise BadRequest(
            400, f"temperature must be 0: this server decodes greedily only (got {temperature!r})"
        )
    if body.get("n", 1) != 1:
        raise BadRequest(400, "n must be 1")
    if body.get("stream", False) is not False:
        raise BadRequest(400, "stream is not supported: send stream false")
    if body.get("stop") not in (None, [], ""):
        raise BadRequest(400, "stop sequences are not supported")


def _max_tokens(body: Mapping[str, Any], limits: Limits, *keys: str) -> int:
    for key in keys:
        if body.get(key) is not None:
            value = _int(body, key, None, 1, limits.max_new_tokens)
            assert value is not None
            return value
    return min(DEFAULT_MAX_TOKENS, limits.max_new_tokens)


def check_prompt(ids: Sequence[int], max_tokens: int, limits: Limits) -> tuple[int, ...]:
    if not ids:
        raise BadRequest(400, "the prompt is empty")
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < limits.vocab_size for t in ids):
        raise BadRequest(400, f"prompt token ids must be integers in [0, {limits.vocab_size})")
    if len(ids) > limits.max_prompt_tokens:
        raise BadRequest(
            400, f"the prompt has {len(ids)} tokens, more than this server's {limits.max_prompt_tokens}"
        )
    if len(ids) + max_tokens > limits.max_positions:
        raise BadRequest(
            400,
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"{limits.max_positions} positions",
        )
    return tuple(ids)


def completion_prompt(body: Mapping[str, Any]) -> str | list[int]:
    """The one prompt of a /v1/completions body: a string or a list of token ids (also either
    wrapped in a one-element list)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise BadRequest(400, "prompt must be a string or a list of token ids (one prompt per request)")


def completion_request(body: Mapping[str, Any], prompt_ids: Sequence[int], limits: Limits) -> Generate:
    _greedy_only(body)
    if body.get("echo", False):
        raise BadRequest(400, "echo is not supported")
    max_tokens = _max_tokens(body, limits, "max_tokens")
    return Generate(
        prompt_ids=check_prompt(prompt_ids, max_tokens, limits),
        max_tokens=max_tokens,
        top_logprobs=_int(body, "logprobs", None, 0, MAX_TOP_LOGPROBS),
        return_token_ids=_bool(body, "return_token_ids"),
        tokens_as_ids=_bool(body, "return_tokens_as_token_ids"),
        ignore_eos=_bool(body, "ignore_eos"),
    )


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The conversation: a list of ``{role, content}`` with string contents, or (as candle-vllm
    accepts) one string, which becomes one user turn."""
    messages = body.get("messages")
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise BadRequest(400, f"messages[{i}] must be an object with string role and content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def enable_thinking(body: Mapping[str, Any]) -> bool:
    """Thinking is on unless the request turns it off (vLLM's chat_template_kwargs, or
    candle-vllm's ``thinking``/``enable_thinking``), as both engines default."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest(400, "chat_template_kwargs must be an object")
    for source, key in ((kwargs, "enable_thinking"), (body, "thinking"), (body, "enable_thinking")):
        if key in source:
            value = source[key]
            if not isinstance(value, bool):
                raise BadRequest(400, f"{key} must be true or false")
            return value
    return True


def chat_request(body: Mapping[str, Any], prompt_ids: Sequence[int], limits: Limits) -> Generate:
    _greedy_only(body)
    max_tokens = _max_tokens(body, limits, "max_completion_tokens", "max_tokens")
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    return Generate(
        prompt_ids=check_prompt(prompt_ids, max_tokens, limits),
        max_tokens=max_tokens,
        top_logprobs=top if logprobs else None,
        return_token_ids=_bool(body, "return_token_ids"),
        tokens_as_ids=_bool(body, "return_tokens_as_token_ids"),
        ignore_eos=_bool(body, "ignore_eos"),
    )
