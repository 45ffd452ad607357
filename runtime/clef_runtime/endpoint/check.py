"""`clef-runtime endpoint-check`: ask the serving engine the goldens' prompts, one at a time,
greedily, and judge each answer (`judge`).  The first prompt that cannot be asked or judged
(timeout, refused connection, an answer that is not the dialect's shape, another template) ends
the run with exit 2; an engine that fails a prompt (HTTP 5xx, the connection lost while it
answers) ends it with exit 3, naming the prompt and the engine's message; divergences are
collected over all prompts.

Needs neither torch nor a GPU: the comparison Job is CPU-only.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx

from clef_contract.endpoint import SHA256_RE, EngineFailure
from clef_runtime import __version__
from clef_runtime.endpoint.dialects import (
    Answer,
    Dialect,
    EngineError,
    EngineFailed,
    ask_ids,
    dialect,
    served_model,
)
from clef_runtime.endpoint.judge import (
    CannotJudge,
    PromptResult,
    Thresholds,
    continuation,
    judge,
    merged,
)
from clef_runtime.endpoint.report import EndpointRun
from clef_runtime.goldens.schema import (
    GoldenPrompt,
    Goldens,
    GoldensError,
    goldens_digest,
    parse_goldens,
    read_goldens_bytes,
)


@dataclass(frozen=True)
class CheckArgs:
    goldens: str | None
    url: str | None
    dialect: str | None
    model: str | None = None
    timeout: float = 600.0
    near_tie_margin: float | None = None
    max_near_ties: int | None = None
    report: str | None = None
    termination_log: str = "/dev/termination-log"
    only: tuple[str, ...] = ()  # prompt names; empty: all
    goldens_sha256: str | None = None  # the digest the goldens must have (the operator's Job sets it)
    # A probe of a serving pod asks `sample` prompts, the `sample_round`-th group of them in turn.
    sample: int | None = None
    sample_round: int = 0


def _thresholds(args: CheckArgs) -> Thresholds:
    t = Thresholds()
    if args.near_tie_margin is None:
        return t
    if not 0 <= args.near_tie_margin <= 5:
        raise GoldensError(f"--near-tie-margin {args.near_tie_margin} must be within [0, 5] nats")
    return Thresholds(args.near_tie_margin, t.logprob_mean, t.logprob_p99)


def _selected(
    goldens: Goldens,
    only: tuple[str, ...],
    sample: int | None = None,
    sample_round: int = 0,
    askable: Callable[[GoldenPrompt], bool] = lambda _: True,
) -> list[GoldenPrompt]:
    """The prompts asked: those named (all without `only`); with `sample`, `sample` of the ones
    the dialect can ask (`askable`) starting at the `sample_round * sample`-th (in file order,
    wrapping), so that successive rounds ask every prompt the engine takes in turn and no round
    draws only prompts it would skip.  A sample with nothing askable is the whole choice: the
    run then says that nothing could be asked."""
    names = {p.name for p in goldens.prompts}
    unknown = sorted(set(only) - names)
    if unknown:
        raise GoldensError(f"no golden prompt named {', '.join(unknown)}")
    chosen = [p for p in goldens.prompts if not only or p.name in only]
    if sample is None:
        return chosen
    if sample < 1 or sample_round < 0:
        raise GoldensError(
            f"--sample {sample} must be at least 1 and --sample-round {sample_round} not negative"
        )
    pool = [p for p in chosen if askable(p)]
    if not pool:
        return chosen
    start = sample_round * sample
    return [pool[(start + i) % len(pool)] for i in range(min(sample, len(pool)))]


def load_goldens(path: str, expected: str | None) -> tuple[Goldens, str]:
    """The goldens at `path` and the sha256 of the bytes they were parsed from, read once.  With
    `expected` (--goldens-sha256), bytes that hash otherwise are refused before anything is asked:
    the goldens changed after they were signed (GoldensMismatch, a GoldensError)."""
    if expected is not None and not SHA256_RE.fullmatch(expected):
        raise GoldensError(f"--goldens-sha256 {expected!r} is not sha256:<64 lowercase hex digits>")
    data = read_goldens_bytes(path)
    digest = goldens_digest(data)
    if expected is not None and digest != expected:
        raise GoldensMismatch(
            f"--goldens-sha256: the goldens at {path} hash to {digest}, not the expected {expected}"
            " (they changed after they were signed); no prompt was sent",
            digest,
        )
    return parse_goldens(data, path), digest


class GoldensMismatch(GoldensError):
    """Goldens whose bytes are not the ones the run was given the digest of."""

    def __init__(self, message: str, digest: str) -> None:
        super().__init__(message)
        self.digest = digest


# The most times one prompt is asked again after near-ties (each flip costs a request).
MAX_CONTINUATIONS = 8


def _judged(
    engine: Dialect,
    client: httpx.Client,
    run: EndpointRun,
    prompt: GoldenPrompt,
    answer: Answer,
    goldens: Goldens,
) -> PromptResult:
    """The prompt judged to its end: after each near-tie the engine is asked again from the
    golden's prefix (dialects that take token ids), so a fault past a flip is still seen."""

    def judged(golden: GoldenPrompt, said: Answer) -> PromptResult:
        return judge(
            golden, said, run.thresholds, real_logprobs=engine.real_logprobs, stop_ids=goldens.stop_ids
        )

    result = segment = judged(prompt, answer)
    while segment.status == "near-tie" and result.divergence is not None:
        at = result.near_ties[-1].position
        rest = continuation(prompt, at)
        if rest is None:
            break
        if not engine.continues or result.continued >= MAX_CONTINUATIONS:
            why = "chat-only dialect" if not engine.continues else f"{MAX_CONTINUATIONS} continuations"
            result.note = f"not judged past the near-tie at position {at} ({why})"
            break
        segment = judged(rest, ask_ids(client, run.model, rest, goldens.top_k))
        result = merged(result, segment, at + 1)
    return result


def _check(args: CheckArgs, run: EndpointRun) -> None:
    if not args.goldens or not args.url:
        raise GoldensError("--goldens and --url are required (or their environment variables)")
    engine = dialect(args.dialect)
    run.real_logprobs = engine.real_logprobs
    run.sampling = dict(engine.sampling)
    run.thresholds = _thresholds(args)
    try:
        goldens, run.goldens_sha256 = load_goldens(args.goldens, args.goldens_sha256)
    except GoldensMismatch as exc:
        run.goldens_sha256 = exc.digest  # the report names what was read, and refused
        raise
    run.dtype = str(goldens.provenance["dtype"])
    run.goldens = {
        "path": args.goldens,
        "sha256": run.goldens_sha256,
        "cacheKey": goldens.cache_key,
        **goldens.provenance,
    }
    prompts = _selected(goldens, args.only, args.sample, args.sample_round, engine.supports)
    run.max_near_ties = args.max_near_ties if args.max_near_ties is not None else max(1, len(prompts) // 4)
    timeout = httpx.Timeout(args.timeout, connect=min(args.timeout, 30.0))
    with httpx.Client(base_url=args.url.rstrip("/"), timeout=timeout) as client:
        run.model = args.model or served_model(client)
        for prompt in prompts:
            if not engine.supports(prompt):
                run.results.append(
                    PromptResult(prompt.name, "skipped", len(prompt.spec.prompt_ids), note="token-id prompt")
                )
                continue
            started = time.perf_counter()
            try:
                answer = engine.ask(client, run.model, prompt, goldens.top_k)
                result = _judged(engine, client, run, prompt, answer, goldens)
            except EngineFailed as exc:  # the engine failed this prompt: its own verdict, and the end
                run.engine_error = EngineFailure(prompt.name, str(exc))
                return
            run.durations[prompt.name] = round(time.perf_counter() - started, 3)
            run.results.append(result)


def emit(run: EndpointRun, out: TextIO, full_path: str | None, termination_log: str) -> None:
    """The full report to `full_path` (stdout without one), the compact one to the termination log."""
    full = json.dumps(run.to_full(), indent=2, ensure_ascii=False) + "\n"
    targets = [(Path(full_path), full)] if full_path else []
    if not full_path:
        out.write(full)
        out.flush()
    for path, text in [*targets, (Path(termination_log), run.to_compact())]:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:  # outside Kubernetes there may be no termination log: stdout has it all
            print(f"endpoint-check: could not write {path}: {exc}", file=sys.stderr)


def run_check(args: CheckArgs, out: TextIO = sys.stdout) -> int:
    run = EndpointRun(
        dialect=args.dialect or "?", url=args.url or "?", runtime_version=__version__, thresholds=Thresholds()
    )
    started = time.perf_counter()
    try:
        _check(args, run)
    except (EngineError, CannotJudge, GoldensError) as exc:
        run.error = str(exc)
    run.durations["total"] = round(time.perf_counter() - started, 3)
    emit(run, out, args.report, args.termination_log)
    print(f"endpoint-check: {run.verdict}: {run.summary()}", file=sys.stderr)
    return run.exit_code
