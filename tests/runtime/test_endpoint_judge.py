"""The divergence rule on hand-made goldens and answers: the cases an engine's HTTP answer can
take that the end-to-end tests do not reach on a tiny model (stop tokens left out or hit early,
capped answers, one-sided top-k membership, prompt-length disagreement)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clef_runtime.endpoint.dialects import Answer
from clef_runtime.endpoint.judge import CannotJudge, Thresholds, continuation, judge, merged, percentile
from clef_runtime.goldens.schema import GoldenPrompt, PromptSpec

STOP = 9


def golden(ids: list[int], finish: str = "length") -> GoldenPrompt:
    """Each step's top-5: the chosen id at -0.1, then ids 100.. at -0.3, -1.0, -2.0, -3.0 (and the
    stop token at -0.4 in second place when it is not the chosen one)."""
    tops, lps = [], []
    for chosen in ids:
        others = [STOP] if chosen != STOP else []
        others += [100, 101, 102, 103]
        tops.append((chosen, *others[:4]))
        lps.append((-0.1, -0.4, -1.0, -2.0, -3.0))
    return GoldenPrompt(
        spec=PromptSpec("p", "chat", "hi", (1, 2, 3), 8),
        ids=tuple(ids),
        logprobs=tuple(-0.1 for _ in ids),
        top_ids=tuple(tops),
        top_logprobs=tuple(lps),
        top_pieces=tuple(tuple(str(t) for t in top) for top in tops),
        finish_reason=finish,
    )


def answer(
    ids: list[int], finish: str = "length", *, top: list[dict[int, float]] | None = None, prompt: int = 3
) -> Answer:
    return Answer(
        ids=tuple(ids),
        logprobs=tuple(-0.1 for _ in ids) if top is not None else None,
        top=tuple(top) if top is not None else None,
        pieces=None,
        prompt_tokens=prompt,
        prompt_ids=None,
        finish_reason=finish,
    )


def run(g: GoldenPrompt, a: Answer, margin: float = 0.5, real: bool = False):  # type: ignore[no-untyped-def]
    return judge(g, a, Thresholds(near_tie_margin=margin), real_logprobs=real, stop_ids=(STOP,))


def test_equal_ids_match() -> None:
    r = run(golden([5, 6, 7]), answer([5, 6, 7]))
    assert r.status == "match" and r.matched == 3 and r.divergence is None


def test_a_stop_token_left_out_of_the_answer_still_matches() -> None:
    # candle-vllm does not list the stop token; vLLM does.  Both match a golden that stopped.
    g = golden([5, 6, STOP], finish="stop")
    assert run(g, answer([5, 6], finish="stop")).status == "match"
    assert run(g, answer([5, 6, STOP], finish="stop")).status == "match"


def test_an_engine_that_stops_early_diverges_at_its_stop_token() -> None:
    r = run(golden([5, 6, 7]), answer([5], finish="stop"))
    assert r.status == "near-tie" and r.divergence is not None
    assert (r.divergence.position, r.divergence.got_id, r.divergence.expected_id) == (1, STOP, 6)
    assert r.divergence.golden_margin == pytest.approx(0.3)
    assert run(golden([5, 6, 7]), answer([5], finish="stop"), margin=0.2).status == "diverged"


def test_a_capped_answer_cannot_be_judged() -> None:
    with pytest.raises(CannotJudge, match="max_tokens capped"):
        run(golden([5, 6, 7]), answer([5, 6], finish="length"))


def test_a_token_outside_the_golden_top_k_is_a_divergence_whatever_the_margin() -> None:
    r = run(golden([5, 6]), answer([5, 77]), margin=5.0)
    assert r.status == "diverged" and r.divergence is not None and r.divergence.golden_margin is None
    assert "not in the golden's top-5" in r.note


def test_real_logprobs_need_mutual_top_k_membership() -> None:
    g = golden([5, 6])
    with_golden = [{5: -0.1}, {100: -0.2, 6: -0.3}]
    without = [{5: -0.1}, {100: -0.2, 101: -0.3}]
    assert run(g, answer([5, 100], top=with_golden), margin=1.0, real=True).status == "near-tie"
    r = run(g, answer([5, 100], top=without), margin=1.0, real=True)
    assert r.status == "diverged" and "not in the engine's top-k" in r.note


def test_logprob_deltas_cover_the_matched_prefix_only() -> None:
    g = golden([5, 6, 7])
    a = Answer((5, 6, 100), (-0.1, -0.35, -5.0), ({}, {}, {7: -0.2}), None, 3, None, "length")
    r = run(g, a, real=True)
    assert r.logprob_deltas == pytest.approx([0.0, 0.25])


@pytest.mark.parametrize(("prompt_tokens", "prompt_ids"), [(4, None), (None, None), (3, (1, 2, 4))])
def test_another_prompt_cannot_be_judged(
    prompt_tokens: int | None, prompt_ids: tuple[int, ...] | None
) -> None:
    a = Answer((5,), None, None, None, prompt_tokens, prompt_ids, "length")
    with pytest.raises(CannotJudge, match="prompt"):
        run(golden([5]), a)


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert (
        percentile(values, 0.99) == 99.0
        and percentile(values, 1.0) == 100.0
        and percentile([3.0], 0.99) == 3.0
    )


# Issue 38, item 2: judged past a near-tie from the golden's prefix; no flip forgiven at a decisive
# position.


def test_a_continuation_asks_from_the_golden_prefix_as_token_ids() -> None:
    g = golden([5, 6, 7, 8])
    rest = continuation(g, 1)
    assert rest is not None and rest.spec.kind == "tokens" and rest.name == "p"
    assert rest.spec.prompt_ids == (1, 2, 3, 5, 6) and rest.spec.max_new_tokens == 2
    assert rest.ids == (7, 8) and rest.top_ids == g.top_ids[2:] and rest.logprobs == g.logprobs[2:]
    assert continuation(g, 3) is None  # nothing left after the last position


def test_a_fault_past_a_near_tie_is_caught_once_continued() -> None:
    g = golden([5, 6, 7, 8])
    head = run(g, answer([5, STOP, 1, 1]))  # a flip to the runner-up at a 0.3-nat margin
    assert head.status == "near-tie" and [d.position for d in head.near_ties] == [1]
    rest = continuation(g, 1)
    assert rest is not None
    tail = run(rest, answer([7, 101], prompt=5))  # then a token 0.9 nats below the golden's
    whole = merged(head, tail, 2)
    assert whole.status == "diverged" and whole.divergence is not None
    assert whole.divergence.position == 3 and whole.divergence.got_id == 101 and not whole.divergence.near_tie
    assert whole.matched == 2 and whole.continued == 1 and [d.position for d in whole.near_ties] == [1]
    clean = merged(head, run(rest, answer([7, 8], prompt=5)), 2)
    assert clean.status == "near-tie" and clean.matched == 3 and clean.divergence == head.divergence


def test_a_runner_up_at_a_decisive_position_fails_with_placeholder_logprobs() -> None:
    g = golden([5, 6, 7])
    decisive = replace(g, top_logprobs=tuple((-0.1, -2.1, -3.0, -4.0, -5.0) for _ in g.ids))
    r = run(decisive, answer([5, STOP, 7]))  # the runner-up, 2 nats below: ids alone judged
    assert (
        r.status == "diverged"
        and r.divergence is not None
        and r.divergence.golden_margin == pytest.approx(2.0)
    )
