"""Response bodies, in the shape of the engine being imitated (``--dialect``).

* ``openai`` (clef's own) and ``vllm``: OpenAI's shapes plus vLLM's extensions, which is what vLLM
  answers (the two names are one surface; ``vllm`` says which engine a test stands in for).
  Completions carry ``token_ids``/``prompt_token_ids`` in the choice, chat carries
  ``prompt_token_ids`` at the top level (vLLM's placement); with ``return_tokens_as_token_ids``
  every token string is ``"token_id:<id>"``.  The stop token, when generated, is in the ids and
  the logprobs, not in the text.
* ``candle-vllm``: chat only; ``logprobs.content[i]`` is ``{"token": <integer id>, "logprob": 0.0,
  "bytes": "<text piece>", "top_logprobs": []}`` (placeholders: candle-vllm computes none), the
  stop token is left out, ``usage`` has candle-vllm's extra fields, errors are ``{"message"}``.
* ``mistralrs`` (mistral.rs 0.8.1, `mistralrs-core/src/response.rs` and its sampler's
  ``TopLogprob``): ``logprobs.content[i]`` is ``{"token": "<text piece>", "logprob": <placeholder>,
  "bytes": [<utf-8 bytes>], "top_logprobs": [{"token": <integer id>, "logprob": <placeholder>,
  "bytes": "<text piece>"}, ...]}``: the id only in ``top_logprobs[0].token``, and no value a
  log-probability (positive, 1.3-1.4, as the real engine's were); ``usage`` has its throughput
  fields, errors are ``{"message"}``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

from clef_runtime.chat import rust_trim
from clef_runtime.generation import Generation
from clef_runtime.serve.requests import Generate

_ids = itertools.count(1)


def _usage(req: Generate, gen: Generation) -> dict[str, int]:
    n = len(gen.ids)
    return {
        "prompt_tokens": len(req.prompt_ids),
        "completion_tokens": n,
        "total_tokens": len(req.prompt_ids) + n,
    }


def _text_ids(gen: Generation) -> list[int]:
    return gen.ids[:-1] if gen.finish_reason == "stop" else gen.ids


def mistralrs_placeholder(logprob: float) -> float:
    """What the stand-in says in mistral.rs's ``logprob`` places: positive, in [1.3, 1.4], rising
    with the probability; not a log-probability (the real engine's were not either)."""
    return round(1.3 + 0.1 * math.exp(logprob), 4)


def error_body(dialect: str, status: int, message: str) -> dict[str, Any]:
    if dialect in ("candle-vllm", "mistralrs"):
        return {"message": message}
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return {"object": "error", "error": {"message": message, "type": kind, "code": status}}


def bad_request_status(dialect: str, status: int) -> int:
    """candle-vllm answers validation errors with 422."""
    return 422 if dialect == "candle-vllm" and status == 400 else status


class Shaper:
    """Builds response bodies for one served model."""

    def __init__(
        self, dialect: str, model: str, piece: Callable[[int], str], decode: Callable[[list[int]], str]
    ):
        self.dialect, self.model, self.piece, self.decode = dialect, model, piece, decode

    def _token(self, token_id: int, as_id: bool) -> str:
        return f"token_id:{token_id}" if as_id else self.piece(token_id)

    def _head(self, kind: str, prefix: str) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{next(_ids)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
        }

    def models(self, max_positions: int) -> dict[str, Any]:
        entry = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "clef"}
        if self.dialect != "candle-vllm":
            entry["max_model_len"] = max_positions
        return {"object": "list", "data": [entry]}

    # ---- /v1/completions ---------------------------------------------------------------------

    def _completion_logprobs(self, req: Generate, gen: Generation) -> dict[str, Any]:
        k = req.top_logprobs or 0
        tokens = [self._token(t, req.tokens_as_ids) for t in gen.ids]
        top = [
            {self._token(t, req.tokens_as_ids): lp for t, lp in zip(ids[:k], lps[:k], strict=True)}
            | {tokens[i]: gen.logprobs[i]}
            for i, (ids, lps) in enumerate(zip(gen.top_ids, gen.top_logprobs, strict=True))
        ]
        offsets = list(itertools.accumulate((len(self.piece(t)) for t in gen.ids[:-1]), initial=0))
        return {"tokens": tokens, "token_logprobs": gen.logprobs, "top_logprobs": top, "text_offset": offsets}

    def completion(self, req: Generate, gen: Generation) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.decode(_text_ids(gen)),
            "logprobs": None if req.top_logprobs is None else self._completion_logprobs(req, gen),
            "finish_reason": gen.finish_reason,
        }
        if req.return_token_ids:
            choice["prompt_token_ids"] = list(req.prompt_ids)
            choice["token_ids"] = list(gen.ids)
        return {**self._head("text_completion", "cmpl"), "choices": [choice], "usage": _usage(req, gen)}

    # ---- /v1/chat/completions ----------------------------------------------------------------

    def _entry(self, token_id: int, logprob: float, as_id: bool) -> dict[str, Any]:
        piece = self.piece(token_id)
        return {"token": self._token(token_id, as_id), "logprob": logprob, "bytes": list(piece.encode())}

    def _mistralrs_logprobs(self, req: Generate, gen: Generation) -> dict[str, Any]:
        k = req.top_logprobs or 0
        content = [
            {
                "token": self.piece(t),
                "logprob": mistralrs_placeholder(gen.logprobs[i]),
                "bytes": list(self.piece(t).encode()),
                "top_logprobs": [
                    {"token": c, "logprob": mistralrs_placeholder(lp), "bytes": self.piece(c)}
                    for c, lp in zip(gen.top_ids[i][:k], gen.top_logprobs[i][:k], strict=True)
                ],
            }
            for i, t in enumerate(gen.ids)
        ]
        return {"content": content}

    def _chat_logprobs(self, req: Generate, gen: Generation) -> dict[str, Any]:
        if self.dialect == "mistralrs":
            return self._mistralrs_logprobs(req, gen)
        if self.dialect == "candle-vllm":
            content = [
                {"token": t, "logprob": 0.0, "bytes": self.piece(t), "top_logprobs": []}
                for t in _text_ids(gen)
            ]
            return {"content": content}
        k = req.top_logprobs or 0
        content = [
            {
                **self._entry(t, gen.logprobs[i], req.tokens_as_ids),
                "top_logprobs": [
                    self._entry(c, lp, req.tokens_as_ids)
                    for c, lp in zip(gen.top_ids[i][:k], gen.top_logprobs[i][:k], strict=True)
                ],
            }
            for i, t in enumerate(gen.ids)
        ]
        return {"content": content}

    def _content(self, gen: Generation) -> str:
        text = self.decode(_text_ids(gen))
        return rust_trim(text) if self.dialect == "candle-vllm" else text  # candle-vllm trims it

    def chat(self, req: Generate, gen: Generation) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": self._content(gen)},
            "logprobs": None if req.top_logprobs is None else self._chat_logprobs(req, gen),
            "finish_reason": gen.finish_reason,
        }
        body = {**self._head("chat.completion", "chatcmpl"), "choices": [choice], "usage": _usage(req, gen)}
        if self.dialect == "candle-vllm":
            body["usage"] |= {
                "request_id": body["id"],
                "created": body["created"],
                "prompt_time_costs": round(gen.prefill_seconds * 1000),
                "completion_time_costs": round(gen.decode_seconds * 1000),
            }
        elif self.dialect == "mistralrs":
            seconds = gen.prefill_seconds + gen.decode_seconds
            body["system_fingerprint"] = "local"
            body["usage"] |= {
                "avg_tok_per_sec": round(len(gen.ids) / seconds, 3) if seconds else 0.0,
                "total_time_sec": round(seconds, 3),
                "total_prompt_time_sec": round(gen.prefill_seconds, 3),
                "total_completion_time_sec": round(gen.decode_seconds, 3),
            }
        elif req.return_token_ids:
            choice["token_ids"] = list(gen.ids)
            body["prompt_token_ids"] = list(req.prompt_ids)
        return body
