"""The endpoint check's outcome: verdict, summary, the full JSON (stdout) and the compact one
(`clef_contract.endpoint`, termination log)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clef_contract.command import ExitCode
from clef_contract.endpoint import (
    ENDPOINT_SCHEMA_VERSION,
    ENDPOINT_SUITE,
    Divergence,
    EndpointReport,
    EngineFailure,
)
from clef_contract.endpoint import build_endpoint_report as build
from clef_contract.report import CompactReport, FailingEntry, Verdict, clip
from clef_runtime.endpoint.judge import PromptResult, Thresholds, percentile


def _describe(d: Divergence) -> str:
    margin = (
        "not in the golden's top-k"
        if d.golden_margin is None
        else f"golden margin {d.golden_margin:.3g} nats"
    )
    return (
        f"prompt {d.prompt}, position {d.position}: expected {d.expected_id} {d.expected_text!r}, "
        f"got {d.got_id} {d.got_text!r} ({margin})"
    )


@dataclass
class EndpointRun:
    dialect: str
    url: str
    runtime_version: str
    thresholds: Thresholds
    max_near_ties: int = 1
    real_logprobs: bool = True
    model: str = ""
    dtype: str = ""
    goldens: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)  # sent with every request, as sent
    goldens_sha256: str | None = None  # what the goldens read hash to (None: none were read)
    results: list[PromptResult] = field(default_factory=list)
    error: str | None = None
    engine_error: EngineFailure | None = None  # the engine failed a prompt (exit 3)
    durations: dict[str, float] = field(default_factory=dict)

    # ---- what was seen ------------------------------------------------------------------

    @property
    def compared(self) -> list[PromptResult]:
        return [r for r in self.results if r.status != "skipped"]

    @property
    def deltas(self) -> list[float]:
        return [d for r in self.results for d in r.logprob_deltas]

    def logprob_stats(self) -> dict[str, float | int] | None:
        deltas = self.deltas
        if not self.real_logprobs or not deltas:
            return None
        return {
            "tokens": len(deltas),
            "mean": round(sum(deltas) / len(deltas), 6),
            "p99": round(percentile(deltas, 0.99), 6),
            "max": round(max(deltas), 6),
        }

    def failing(self) -> list[FailingEntry]:
        out = [
            FailingEntry(f"prompt {r.name}: token ids", "endpoint", _describe(r.divergence) + f"; {r.note}")
            for r in self.results
            if r.status == "diverged" and r.divergence is not None
        ]
        near = [r.name for r in self.results if r.status == "near-tie"]
        if len(near) > self.max_near_ties:
            out.append(
                FailingEntry(
                    "near-ties",
                    "endpoint",
                    f"{len(near)} prompts diverged at near-ties ({', '.join(near)}), more than "
                    f"{self.max_near_ties}: a systematic shift, not rounding",
                )
            )
        stats = self.logprob_stats()
        t = self.thresholds
        if stats is not None:
            for key, limit in (("mean", t.logprob_mean), ("p99", t.logprob_p99)):
                if stats[key] > limit:
                    out.append(
                        FailingEntry(
                            f"logprobs: {key} |Δ|",
                            "endpoint",
                            f"{key} |Δ logprob| {stats[key]:.3g} > {limit:g} over {stats['tokens']} matched tokens",
                        )
                    )
        return out

    @property
    def verdict(self) -> Verdict:
        if self.error_text is not None:
            return "error"
        return "fail" if self.failing() else "pass"

    @property
    def error_text(self) -> str | None:
        if self.error is not None:
            return self.error
        if self.engine_error is not None:
            e = self.engine_error
            return f"the engine failed prompt {e.prompt}: {e.message}"
        return None if self.compared else "no prompt could be asked in this dialect: nothing was compared"

    @property
    def exit_code(self) -> int:
        if self.error is None and self.engine_error is not None:
            return int(ExitCode.ENGINE_FAILED)
        return int(ExitCode.for_verdict(self.verdict))

    def first_divergence(self) -> Divergence | None:
        divergences = [r.divergence for r in self.results if r.divergence is not None]
        hard = [d for d in divergences if not d.near_tie]
        return (hard or divergences)[0] if divergences else None

    def summary(self) -> str:
        if self.error is None and self.engine_error is not None:
            return f"engine error: {self.error_text}"
        if self.error_text is not None:
            return f"could not run: {self.error_text}"
        parts = []
        first = self.first_divergence()
        if first is not None and not first.near_tie:
            parts.append(f"FAIL {_describe(first)}")
        compared = self.compared
        exact = sum(r.status == "match" for r in compared)
        parts.append(f"prompts {exact}/{len(compared)} exact")
        near = sum(r.status == "near-tie" for r in compared)
        if near:
            parts.append(f"{near} near-tie{'s' if near > 1 else ''}")
        continued = sum(r.continued for r in compared)
        if continued:
            parts.append(
                f"judged past {continued} near-tie{'s' if continued > 1 else ''} from the golden prefix"
            )
        parts.append(
            f"tokens {sum(r.matched for r in compared)}/{sum(r.golden_tokens for r in compared)} equal"
        )
        skipped = len(self.results) - len(compared)
        if skipped:
            parts.append(f"{skipped} token-id prompts skipped ({self.dialect} takes chat only)")
        stats = self.logprob_stats()
        if stats is not None:
            parts.append(f"|Δ logprob| mean {stats['mean']:.3g} p99 {stats['p99']:.3g}")
        elif not self.real_logprobs:
            parts.append("logprobs are placeholders: ids alone judged")
        return ", ".join(parts)

    # ---- serialisation -------------------------------------------------------------------

    def to_full(self) -> dict[str, Any]:
        t = self.thresholds
        return {
            "schemaVersion": ENDPOINT_SCHEMA_VERSION,
            "verdict": self.verdict,
            "exitCode": self.exit_code,
            "summary": self.summary(),
            "dialect": self.dialect,
            "url": self.url,
            "model": self.model,
            "dtype": self.dtype,
            "runtimeVersion": self.runtime_version,
            "logprobs": "compared" if self.real_logprobs else "placeholder",
            "sampling": self.sampling,
            "thresholds": {
                "nearTieMargin": t.near_tie_margin,
                "maxNearTies": self.max_near_ties,
                "logprobMean": t.logprob_mean,
                "logprobP99": t.logprob_p99,
            },
            "logprobStats": self.logprob_stats(),
            "goldens": self.goldens,
            "goldensSha256": self.goldens_sha256,
            "error": self.error_text,
            "engineError": None
            if self.engine_error is None
            else {"prompt": self.engine_error.prompt, "message": self.engine_error.message},
            "failing": [{"name": f.name, "op": f.op, "detail": f.detail} for f in self.failing()],
            "durations": self.durations,
            "prompts": [r.to_json() for r in self.results],
        }

    def to_compact(self) -> str:
        return build(
            EndpointReport(
                compact=CompactReport(
                    verdict=self.verdict,
                    summary=self.summary(),
                    failing=tuple(self.failing()),
                    suite=ENDPOINT_SUITE,
                    dtype=self.dtype,
                    device=clip(f"{self.model or '?'} at {self.url}", 200),
                    runtime_version=self.runtime_version,
                    error=self.error_text,
                ),
                dialect=self.dialect,
                logprobs="compared" if self.real_logprobs else "placeholder",
                first_divergence=self.first_divergence(),
                goldens_sha256=self.goldens_sha256,
                engine_error=self.engine_error if self.error is None else None,
            )
        )
