"""Greedy generation of one prompt with the top-k logprobs of every step: what goldens record and
what `clef-runtime serve` answers, computed by the same function so the two agree by construction.

Logprobs are ``log_softmax`` of the float32 logits (before any sampling setting, as vLLM reports
them).  The chosen token is the argmax; generation ends after a stop token (unless
``ignore_eos``) or after ``max_new_tokens``.  The stop token, when hit, is the last generated id.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from clef_runtime.model import HybridModel

FinishReason = Literal["stop", "length"]


@dataclass
class Generation:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of each chosen id
    top_ids: list[list[int]] = field(default_factory=list)  # per step, best first
    top_logprobs: list[list[float]] = field(default_factory=list)
    finish_reason: FinishReason = "length"
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    def add(self, logits: torch.Tensor, top_k: int) -> int:
        """Record one step from its float32 logits ``[vocab]``; return the chosen id."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        values, indices = torch.topk(logp, min(top_k, logp.shape[-1]))
        chosen = int(torch.argmax(logits))
        self.ids.append(chosen)
        self.logprobs.append(float(logp[chosen]))
        self.top_ids.append([int(i) for i in indices.tolist()])
        self.top_logprobs.append([float(v) for v in values.tolist()])
        return chosen


def greedy(
    model: HybridModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    top_k: int,
    stop_ids: Sequence[int] = (),
    ignore_eos: bool = False,
) -> Generation:
    """Greedy continuation of one prompt (batch of one: no padding, no batch-dependent numerics)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: at least one token is needed")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be at least 1")
    stops = set() if ignore_eos else set(stop_ids)
    out = Generation()
    started = time.perf_counter()
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    logits, cache = model.prefill(ids, last_only=True)
    chosen = out.add(logits[0, -1], top_k)  # reads the logits back: the prefill has finished
    out.prefill_seconds = time.perf_counter() - started
    while chosen not in stops and len(out.ids) < max_new_tokens:
        step = model.decode_step(torch.tensor([chosen], dtype=torch.long), cache)
        chosen = out.add(step[0], top_k)
    out.finish_reason = "stop" if chosen in stops else "length"
    out.decode_seconds = time.perf_counter() - started - out.prefill_seconds
    return out
