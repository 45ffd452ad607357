"""How each engine is asked one golden prompt, greedily, and how its answer is read back.

* ``vllm``: ``POST /v1/completions`` with the golden's prompt *ids* (tokenizer and template drop out
  of the comparison), ``logprobs: k``, ``return_token_ids`` and ``return_tokens_as_token_ids`` (so
  every token and top-k key is ``"token_id:<id>"``).  Real logprobs.
* ``clef`` (`clef-runtime serve`): chat prompts through ``POST /v1/chat/completions`` with the
  user turn and ``chat_template_kwargs: {enable_thinking: false}``, so the engine's own template
  rendering is checked against the golden's ids (``prompt_token_ids``); token-id prompts through
  ``/v1/completions`` as for vLLM.  Real logprobs.
* ``candle-vllm``: chat only (it has no raw-prompt route: token-id prompts are skipped and the
  report says so), ``thinking: false``, ``logprobs: true``; ``token`` is the integer id,
  ``logprob`` a placeholder 0.0 and ``top_logprobs`` empty, so ids alone are judged; the prompt
  length comes from ``usage.prompt_tokens``.
* ``mistralrs`` (mistral.rs 0.8.1): chat only, ``enable_thinking: false``, ``logprobs: true``,
  ``top_logprobs: 1``; the id is ``top_logprobs[0].token`` (``content[].token`` is the text piece)
  and every logprob value is a placeholder, so ids alone are judged.

Every request is greedy with neutral sampling (`VLLM_SAMPLING`, `CANDLE_SAMPLING`: no penalties, no
top-k/top-p cut, a seed where the engine takes one) and asks for the golden's number of new tokens.  A response
that is not the expected shape raises `EngineError` (exit 2), never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from clef_runtime.goldens.schema import GoldenPrompt


class EngineError(Exception):
    """The engine could not be asked or its answer could not be read (exit 2)."""


class EngineFailed(EngineError):
    """The engine itself failed the request: an HTTP 5xx answer, or the connection lost while it
    was answering (a crash).  Its own verdict (exit 3, `EngineError`), not a numeric mismatch."""


@dataclass(frozen=True)
class Answer:
    ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # None: placeholders, not probabilities
    top: tuple[dict[int, float], ...] | None  # per step: candidate id -> logprob
    pieces: tuple[str, ...] | None  # each generated token's text, when the engine gives it
    prompt_tokens: int | None  # usage.prompt_tokens
    prompt_ids: tuple[int, ...] | None  # when the engine returns them
    finish_reason: str | None


# ---------------------------------------------------------------------------------- reading


def _get(obj: Any, *path: str | int) -> Any:
    """obj[path...], or EngineError naming the missing step."""
    where = "response"
    for key in path:
        where += f"[{key!r}]"
        try:
            obj = obj[key]
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"unexpected response shape: no {where}") from None
    return obj


def _id(value: Any, where: str) -> int:
    """A token id as an integer, or as vLLM's ``"token_id:<id>"`` string."""
    if isinstance(value, str) and value.startswith("token_id:"):
        value = value.removeprefix("token_id:")
        if value.isdigit():
            return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise EngineError(f"unexpected response shape: {where} is {value!r}, not a token id")


def _ids(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise EngineError(f"unexpected response shape: {where} is not a list")
    return tuple(_id(v, f"{where}[{i}]") for i, v in enumerate(raw))


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineError(f"unexpected response shape: {where} is {value!r}, not a number")
    return float(value)


def _prompt_tokens(body: Mapping[str, Any]) -> int | None:
    usage = body.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finish(choice: Mapping[str, Any]) -> str | None:
    value = choice.get("finish_reason")
    return value if isinstance(value, str) else None


def _completion_answer(body: Any) -> Answer:
    """vLLM's /v1/completions shape (clef answers the same)."""
    choice = _get(body, "choices", 0)
    logprobs = _get(choice, "logprobs")
    tokens = _ids(_get(logprobs, "tokens"), "logprobs.tokens")
    ids = _ids(choice["token_ids"], "token_ids") if "token_ids" in choice else tokens
    if ids != tokens:
        raise EngineError("unexpected response: token_ids and logprobs.tokens disagree")
    lps = _get(logprobs, "token_logprobs")
    tops = _get(logprobs, "top_logprobs")
    if not isinstance(lps, list) or not isinstance(tops, list) or not len(lps) == len(tops) == len(ids):
        raise EngineError("unexpected response shape: logprobs lists of different lengths")
    top = tuple(
        {_id(k, f"top_logprobs[{i}] key"): _number(v, f"top_logprobs[{i}]") for k, v in _get(tops, i).items()}
        if isinstance(tops[i], dict)
        else {}
        for i in range(len(ids))
    )
    logprobs_ = tuple(_number(v, f"token_logprobs[{i}]") for i, v in enumerate(lps))
    return _openai_answer(body, choice, ids, logprobs_, top)


def _openai_answer(
    body: Any,
    choice: Any,
    ids: tuple[int, ...],
    logprobs: tuple[float, ...],
    top: tuple[dict[int, float], ...],
) -> Answer:
    """An answer with real logprobs; the prompt's ids where the engine echoes them (vLLM puts them
    in the choice for completions, at the top level for chat)."""
    prompt_ids = choice.get("prompt_token_ids", body.get("prompt_token_ids"))
    return Answer(
        ids=ids,
        logprobs=logprobs,
        top=top,
        pieces=None,
        prompt_tokens=_prompt_tokens(body),
        prompt_ids=None if prompt_ids is None else _ids(prompt_ids, "prompt_token_ids"),
        finish_reason=_finish(choice),
    )


def _chat_content(body: Any) -> tuple[Any, list[Any], tuple[int, ...]]:
    """The first choice, its ``logprobs.content`` list and the token ids in it."""
    choice = _get(body, "choices", 0)
    content = _get(choice, "logprobs", "content")
    if not isinstance(content, list):
        raise EngineError("unexpected response shape: logprobs.content is not a list")
    return (
        choice,
        content,
        tuple(_id(_get(e, "token"), f"logprobs.content[{i}].token") for i, e in enumerate(content)),
    )


def _chat_answer(body: Any) -> Answer:
    """OpenAI's chat shape with vLLM's extensions (clef answers it)."""
    choice, content, ids = _chat_content(body)
    if "token_ids" in choice and _ids(choice["token_ids"], "token_ids") != ids:
        raise EngineError("unexpected response: token_ids and logprobs.content disagree")
    top = tuple(
        {
            _id(_get(c, "token"), f"content[{i}].top_logprobs"): _number(_get(c, "logprob"), "logprob")
            for c in _get(e, "top_logprobs")
        }
        for i, e in enumerate(content)
    )
    chosen = tuple(_number(_get(e, "logprob"), f"content[{i}].logprob") for i, e in enumerate(content))
    return _openai_answer(body, choice, ids, chosen, top)


def _candle_answer(body: Any) -> Answer:
    """candle-vllm's chat shape: integer ids in ``token``, the text piece in ``bytes``."""
    choice, content, ids = _chat_content(body)
    pieces = tuple(e.get("bytes") if isinstance(e.get("bytes"), str) else "" for e in content)
    # No logprobs, no top-k, no prompt ids: candle-vllm returns placeholders and no prompt.
    return Answer(ids, None, None, pieces, _prompt_tokens(body), None, _finish(choice))


def _mistralrs_answer(body: Any) -> Answer:
    """mistral.rs 0.8.1's chat shape: ``content[i].token`` is the text piece, the integer id sits in
    ``content[i].top_logprobs[0].token`` (its text in ``bytes``), and no ``logprob`` value is a
    log-probability (positive, about 1.3-1.4): placeholders, ids alone judged."""
    choice = _get(body, "choices", 0)
    content = _get(choice, "logprobs", "content")
    if not isinstance(content, list):
        raise EngineError("unexpected response shape: logprobs.content is not a list")
    ids = tuple(
        _id(_get(e, "top_logprobs", 0, "token"), f"logprobs.content[{i}].top_logprobs[0].token")
        for i, e in enumerate(content)
    )
    pieces = tuple(e.get("token") if isinstance(e.get("token"), str) else "" for e in content)
    return Answer(ids, None, None, pieces, _prompt_tokens(body), None, _finish(choice))


# ---------------------------------------------------------------------------------- asking


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    """POST and parse JSON; every way this can go wrong is an EngineError saying which."""
    try:
        response = client.post(path, json=body)
    except httpx.TimeoutException as exc:
        raise EngineError(f"POST {path}: timed out ({type(exc).__name__})") from None
    except httpx.ConnectError as exc:  # not reached at all: nothing was asked
        raise EngineError(f"POST {path}: {type(exc).__name__}: {exc}") from None
    except httpx.TransportError as exc:  # reached, then lost while answering: the engine died
        raise EngineFailed(f"POST {path}: the connection was lost: {type(exc).__name__}: {exc}") from None
    except httpx.HTTPError as exc:
        raise EngineError(f"POST {path}: {type(exc).__name__}: {exc}") from None
    return _json(response, f"POST {path}")


def engine_message(text: str) -> str:
    """The engine's own words from an error body: ``{"message": ...}`` (candle-vllm),
    ``{"error": {"message": ...}}`` (OpenAI, vLLM), ``{"detail": ...}``, or the text itself."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    error = body.get("error") if isinstance(body, dict) else None
    for said in (
        body.get("message") if isinstance(body, dict) else None,
        error.get("message") if isinstance(error, dict) else error,
        body.get("detail") if isinstance(body, dict) else None,
    ):
        if isinstance(said, str) and said.strip():
            return said.strip()[:500]
    return text.strip()[:500]


def _json(response: httpx.Response, what: str) -> Any:
    if response.status_code >= 500:
        raise EngineFailed(f"{what}: HTTP {response.status_code}: {engine_message(response.text)}")
    if response.status_code != 200:
        raise EngineError(f"{what}: HTTP {response.status_code}: {response.text[:300]!r}")
    try:
        return response.json()
    except ValueError:
        raise EngineError(f"{what}: the answer is not JSON: {response.text[:120]!r}") from None


def served_model(client: httpx.Client) -> str:
    try:
        response = client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise EngineError(f"GET /v1/models: {type(exc).__name__}: {exc}") from None
    model = _get(_json(response, "GET /v1/models"), "data", 0, "id")
    if not isinstance(model, str):
        raise EngineError("GET /v1/models: data[0].id is not a string")
    return model


class Dialect(Protocol):
    name: str
    real_logprobs: bool
    sampling: Mapping[str, Any]  # sent with every request, as it is
    continues: bool  # takes token-id prompts: can be asked again from a golden prefix

    def supports(self, prompt: GoldenPrompt) -> bool: ...

    def ask(self, client: httpx.Client, model: str, prompt: GoldenPrompt, top_k: int) -> Answer: ...


# Neutral sampling, sent with every request: greedy, and nothing that reshapes the logits before
# the argmax.  Engines fill what a request leaves out from the checkpoint's generation_config.json
# (vLLM applies its repetition/presence/frequency penalties even at temperature 0), so every field
# an engine reads is sent at its neutral value, in that engine's own spelling; a seed where it
# takes one.  The report records the dict sent (`sampling`).
GREEDY: Mapping[str, Any] = {"temperature": 0}
PENALTIES_OFF: Mapping[str, Any] = {"presence_penalty": 0.0, "frequency_penalty": 0.0}
VLLM_SAMPLING: Mapping[str, Any] = {
    **GREEDY,
    **PENALTIES_OFF,
    "repetition_penalty": 1.0,
    "top_k": -1,  # vLLM: -1 disables (0 too since 0.7; -1 is accepted by every version)
    "top_p": 1.0,
    "min_p": 0.0,
    "seed": 0,
}
# candle-vllm's ChatCompletionRequest (src/openai/requests.rs): presence/frequency penalties,
# top_k (isize, -1 disables), top_p, min_p; no repetition_penalty field, no per-request seed.
CANDLE_SAMPLING: Mapping[str, Any] = {**GREEDY, **PENALTIES_OFF, "top_k": -1, "top_p": 1.0, "min_p": 0.0}

# mistral.rs 0.8.1's ChatCompletionRequest (mistralrs-server-core/src/openai.rs): presence and
# frequency penalties, top_p, min_p and its DRY penalty (dry_multiplier 0 turns it off); top_k is
# an unsigned Option (left out: no cut), no repetition_penalty field, no per-request seed.
MISTRALRS_SAMPLING: Mapping[str, Any] = {
    **GREEDY,
    **PENALTIES_OFF,
    "top_p": 1.0,
    "min_p": 0.0,
    "dry_multiplier": 0.0,
}


def _base(model: str, prompt: GoldenPrompt, sampling: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": model, "max_tokens": prompt.spec.max_new_tokens, **sampling}


def _user(prompt: GoldenPrompt) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt.spec.text}]


def ask_ids(client: httpx.Client, model: str, prompt: GoldenPrompt, top_k: int) -> Answer:
    body = _base(model, prompt, VLLM_SAMPLING) | {
        "prompt": list(prompt.spec.prompt_ids),
        "logprobs": top_k,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    return _completion_answer(post(client, "/v1/completions", body))


class Vllm:
    name = "vllm"
    real_logprobs = True
    sampling = VLLM_SAMPLING
    continues = True

    def supports(self, prompt: GoldenPrompt) -> bool:
        return True

    def ask(self, client: httpx.Client, model: str, prompt: GoldenPrompt, top_k: int) -> Answer:
        return ask_ids(client, model, prompt, top_k)


class Clef(Vllm):
    """vLLM's questions for token-id prompts; chat prompts through the engine's template."""

    name = "clef"

    def ask(self, client: httpx.Client, model: str, prompt: GoldenPrompt, top_k: int) -> Answer:
        if prompt.spec.kind == "tokens":
            return ask_ids(client, model, prompt, top_k)
        body = _base(model, prompt, self.sampling) | {
            "messages": _user(prompt),
            "logprobs": True,
            "top_logprobs": top_k,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        return _chat_answer(post(client, "/v1/chat/completions", body))


class CandleVllm:
    name = "candle-vllm"
    real_logprobs = False
    sampling = CANDLE_SAMPLING
    continues = False  # chat only: no raw prompt to continue from

    def supports(self, prompt: GoldenPrompt) -> bool:
        return prompt.spec.kind == "chat"

    def ask(self, client: httpx.Client, model: str, prompt: GoldenPrompt, top_k: int) -> Answer:
        body = _base(model, prompt, self.sampling) | {
            "messages": _user(prompt),
            "logprobs": True,
            "thinking": False,
        }
        return _candle_answer(post(client, "/v1/chat/completions", body))


class Mistralrs:
    """mistral.rs: chat only (a token-id prompt is refused with 422), ``enable_thinking: false``
    at the top level, one top logprob per step to carry the id."""

    name = "mistralrs"
    real_logprobs = False
    sampling = MISTRALRS_SAMPLING
    continues = False  # a token-id prompt is refused with 422

    def supports(self, prompt: GoldenPrompt) -> bool:
        return prompt.spec.kind == "chat"

    def ask(self, client: httpx.Client, model: str, prompt: GoldenPrompt, top_k: int) -> Answer:
        body = _base(model, prompt, self.sampling) | {
            "messages": _user(prompt),
            "logprobs": True,
            "top_logprobs": 1,
            "enable_thinking": False,
        }
        return _mistralrs_answer(post(client, "/v1/chat/completions", body))


DIALECTS: dict[str, Dialect] = {d.name: d for d in (Clef(), Vllm(), CandleVllm(), Mistralrs())}


def dialect(name: str | None) -> Dialect:
    if name not in DIALECTS:
        raise EngineError(f"dialect {name!r} is not one of {', '.join(DIALECTS)}")
    return DIALECTS[name]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
