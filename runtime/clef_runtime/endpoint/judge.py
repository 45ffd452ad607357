"""The divergence rule: one golden prompt against one engine answer (pure: no I/O).

Walk the greedy ids in lockstep.  Equal everywhere: a match.  At the first position where they
differ, the answer may still be right if the golden itself nearly chose the engine's token: the
engine's token is in the golden's top-k there and the golden's logprob margin between the two is
at most `Thresholds.near_tie_margin`; with real engine logprobs, the golden's token must also be in
the engine's top-k (mutual membership).  That is a *near-tie*; anything else is a *divergence*.
After a near-tie the two continuations legitimately differ, so the engine is asked again from the
golden's prefix (the prompt and the golden's tokens through that position: `continuation`), where
the dialect takes token ids, and the rest of the prompt is judged the same way (`merged`): a
fault that shows only after a flip is still caught.  A divergence ends the prompt.

A prompt length other than the golden's, or engine-side ids of the prompt other than the golden's,
is a template or tokenizer mismatch: `CannotJudge` (exit 2), since the engine was not asked the
golden's question.  An engine that stops early without a stop token cannot be judged either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from clef_contract.endpoint import Divergence
from clef_runtime.endpoint.dialects import Answer, first_difference
from clef_runtime.goldens.schema import GoldenPrompt, PromptSpec

# Why these numbers: docs/verification.md, "Endpoint verification".
NEAR_TIE_MARGIN = 0.5  # nats
LOGPROB_MEAN = 0.06  # mean |Δ logprob| of the chosen tokens on the matched prefixes
LOGPROB_P99 = 0.20


class CannotJudge(Exception):
    """The engine's answer cannot be compared with the golden (exit 2)."""


@dataclass(frozen=True)
class Thresholds:
    near_tie_margin: float = NEAR_TIE_MARGIN
    logprob_mean: float = LOGPROB_MEAN
    logprob_p99: float = LOGPROB_P99


@dataclass
class PromptResult:
    name: str
    status: str  # "match" | "near-tie" | "diverged" | "skipped"
    golden_prompt_tokens: int
    engine_prompt_tokens: int | None = None
    matched: int = 0  # generated positions equal to the golden's before any divergence
    golden_tokens: int = 0
    divergence: Divergence | None = None
    logprob_deltas: list[float] = field(default_factory=list)
    note: str = ""
    near_ties: list[Divergence] = field(default_factory=list)  # every near-tie passed, in order
    continued: int = 0  # times the engine was asked again from the golden's prefix

    def to_json(self) -> dict[str, object]:
        d = self.divergence
        return {
            "name": self.name,
            "status": self.status,
            "promptTokens": {"golden": self.golden_prompt_tokens, "engine": self.engine_prompt_tokens},
            "matched": self.matched,
            "goldenTokens": self.golden_tokens,
            "divergence": None
            if d is None
            else {
                "position": d.position,
                "expectedId": d.expected_id,
                "expectedText": d.expected_text,
                "gotId": d.got_id,
                "gotText": d.got_text,
                "goldenMargin": d.golden_margin,
                "nearTie": d.near_tie,
            },
            "maxLogprobDelta": round(max(self.logprob_deltas), 6) if self.logprob_deltas else None,
            "nearTies": [{"position": n.position, "goldenMargin": n.golden_margin} for n in self.near_ties],
            "continued": self.continued,
            "note": self.note,
        }


def _check_prompt(golden: GoldenPrompt, answer: Answer) -> None:
    want = golden.spec.prompt_ids
    if answer.prompt_ids is not None and answer.prompt_ids != want:
        i = first_difference(answer.prompt_ids, want)
        raise CannotJudge(
            f"prompt {golden.name}: the engine's prompt ids differ from the golden's at position {i} "
            f"({len(answer.prompt_ids)} vs {len(want)} ids): another chat template or tokenizer"
        )
    if answer.prompt_tokens is None:
        raise CannotJudge(f"prompt {golden.name}: the engine did not report usage.prompt_tokens")
    if answer.prompt_tokens != len(want):
        raise CannotJudge(
            f"prompt {golden.name}: the engine counts {answer.prompt_tokens} prompt tokens, the golden "
            f"{len(want)}: another chat template or tokenizer (thinking switch honoured?)"
        )


def _engine_token_at_end(golden: GoldenPrompt, answer: Answer, stop_ids: Sequence[int]) -> int | None:
    """The engine's token just past its last returned one, when it stopped before the golden did:
    a stop token it did not list (candle-vllm leaves it out).  None when the answer ends with the
    golden (a match)."""
    n, g = len(answer.ids), len(golden.ids)
    if n >= g:
        return None
    if n == g - 1 and golden.finish_reason == "stop" and answer.finish_reason == "stop":
        return None  # the same stop token, left out of the list
    if answer.finish_reason != "stop" or not stop_ids:
        raise CannotJudge(
            f"prompt {golden.name}: the engine returned {n} tokens where {g} were asked, without "
            f"stopping (finish_reason {answer.finish_reason!r}): is max_tokens capped?"
        )
    top = golden.top_ids[n]
    return next((s for s in stop_ids if s in top), stop_ids[0])


def _piece(golden: GoldenPrompt, answer: Answer, position: int, token: int) -> str:
    if answer.pieces is not None and position < len(answer.pieces) and answer.ids[position] == token:
        return answer.pieces[position]
    return golden.piece(position, token) or ""


def judge(
    golden: GoldenPrompt,
    answer: Answer,
    thresholds: Thresholds,
    *,
    real_logprobs: bool,
    stop_ids: Sequence[int],
) -> PromptResult:
    _check_prompt(golden, answer)
    result = PromptResult(
        golden.name,
        "match",
        len(golden.spec.prompt_ids),
        answer.prompt_tokens,
        golden_tokens=len(golden.ids),
    )
    common = min(len(answer.ids), len(golden.ids))
    position = first_difference(answer.ids[:common], golden.ids[:common])
    result.matched = position
    if real_logprobs and answer.logprobs is not None:
        result.logprob_deltas = [abs(answer.logprobs[i] - golden.logprobs[i]) for i in range(position)]
    got = answer.ids[position] if position < common else _engine_token_at_end(golden, answer, stop_ids)
    if got is None:
        return result
    signed = golden.margin(position, got)  # ≥ 0 when the golden chose its argmax, as it does
    margin = None if signed is None else abs(signed)
    expected = golden.ids[position]
    mutual = not real_logprobs or (answer.top is not None and expected in answer.top[position])
    near_tie = margin is not None and margin <= thresholds.near_tie_margin and mutual
    result.status = "near-tie" if near_tie else "diverged"
    result.divergence = Divergence(
        prompt=golden.name,
        position=position,
        expected_id=expected,
        expected_text=golden.piece(position, expected) or "",
        got_id=got,
        got_text=_piece(golden, answer, position, got),
        golden_margin=margin,
        near_tie=near_tie,
    )
    if near_tie:
        result.near_ties.append(result.divergence)
    if margin is None:
        result.note = f"the engine's token is not in the golden's top-{len(golden.top_ids[position])}"
    elif not mutual:
        result.note = "the golden's token is not in the engine's top-k"
    elif not near_tie:
        result.note = f"golden margin {margin:.3g} nats > {thresholds.near_tie_margin:g}"
    return result


def continuation(golden: GoldenPrompt, position: int) -> GoldenPrompt | None:
    """The golden from just after `position`, asked as token ids: the prompt followed by the
    golden's tokens through `position`.  None when nothing is left to judge."""
    rest = slice(position + 1, None)
    if not golden.ids[rest]:
        return None
    spec = PromptSpec(
        golden.name,
        "tokens",
        "",
        golden.spec.prompt_ids + golden.ids[: position + 1],
        len(golden.ids) - position - 1,
    )
    return GoldenPrompt(
        spec,
        golden.ids[rest],
        golden.logprobs[rest],
        golden.top_ids[rest],
        golden.top_logprobs[rest],
        golden.top_pieces[rest],
        golden.finish_reason,
    )


def merged(head: PromptResult, tail: PromptResult, offset: int) -> PromptResult:
    """`head` (ending at a near-tie) followed by `tail`, the judgement of its continuation from
    the golden's prefix (`offset`: the continuation's first position in the whole answer)."""

    def shifted(d: Divergence) -> Divergence:
        return replace(d, position=d.position + offset)

    divergence = (
        shifted(tail.divergence) if tail.status == "diverged" and tail.divergence else head.divergence
    )
    return replace(
        head,
        status="diverged" if tail.status == "diverged" else "near-tie",
        matched=head.matched + tail.matched,
        divergence=divergence,
        logprob_deltas=head.logprob_deltas + tail.logprob_deltas,
        note=tail.note if tail.status == "diverged" else head.note,
        near_ties=head.near_ties + [shifted(d) for d in tail.near_ties],
        continued=head.continued + 1,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank rule."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))
    return ordered[int(rank) - 1]
