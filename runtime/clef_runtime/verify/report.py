"""The verification report: the full JSON for stdout and the compact one for the termination log.

The compact report is what the operator reads from the verification pod's termination message;
its fields, size bound and builder are the contract's (`clef_contract.report`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from clef_contract.command import ExitCode
from clef_contract.report import SCHEMA_VERSION, CompactReport, FailingEntry, Verdict, build_report, clip

# Metrics whose failure names the broken slice or the exception (see `failing`).
_SPECIFIC_METRICS = frozenset({"dead_slices", "raised", "inputs_modified", "results_changed"})


@dataclass
class Check:
    """One named measurement against one threshold."""

    name: str  # e.g. "causal_conv1d/prefill: coverage"
    op: str  # the op (or "model") the check is about
    suite: str  # "kernels" or "model"
    passed: bool
    metric: str  # what `value` measures, e.g. "rel_rms", "dead_slices", "token_ids_equal"
    value: float | int | str | None
    threshold: float | int | str | None
    detail: str = ""
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    suite: str
    dtype: str
    device: str
    runtime_version: str
    shapes: str  # "model" or "reduced"
    fault: str | None = None
    kernel_config: str | None = None  # what the chunked delta rule ran: "fma", "tensor-core" (+ " (forced)")
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    durations: dict[str, float] = field(default_factory=dict)
    peak_gpu_memory_bytes: int | None = None
    environment: dict[str, str] = field(default_factory=dict)
    model_shape: dict[str, Any] = field(default_factory=dict)
    layer_stats: list[dict[str, Any]] = field(default_factory=list)
    summary_parts: list[str] = field(default_factory=list)

    # ---- verdict ------------------------------------------------------------------------

    @property
    def failing(self) -> list[Check]:
        """Failing checks, the most specific first: a dead band/head/state slice or a kernel that
        raised says *what* broke ("key channel band [2048, 4096) is zero"); then the model's
        checks (token ids, logits, per-layer statistics: what the bug does to answers); last the
        error metrics of the ops, which only say that something broke."""
        bad = [c for c in self.checks if not c.passed]
        return sorted(
            bad, key=lambda c: 0 if c.metric in _SPECIFIC_METRICS else 1 if c.suite == "model" else 2
        )

    @property
    def verdict(self) -> Verdict:
        if self.error is not None:
            return "error"
        if not self.checks:
            # Nothing was measured: that proves nothing, so it cannot pass (fail closed).
            return "error"
        return "fail" if self.failing else "pass"

    @property
    def error_text(self) -> str | None:
        if self.error is not None:
            return self.error
        return "no checks ran" if not self.checks else None

    @property
    def exit_code(self) -> int:
        return int(ExitCode.for_verdict(self.verdict))

    def summary(self) -> str:
        """One line an on-call engineer can read in `kubectl get` output."""
        if self.error_text is not None:
            return f"could not run: {self.error_text}"
        head: list[str] = []
        if self.failing:
            first = self.failing[0]
            head.append(f"FAIL {clip(first.detail or first.name, 300)}")
            if len(self.failing) > 1:
                head.append(f"{len(self.failing) - 1} more failing")
        passed = sum(c.passed for c in self.checks)
        head.append(f"checks {passed}/{len(self.checks)}")
        return ", ".join(head + self.summary_parts)

    # ---- serialisation -------------------------------------------------------------------

    def to_full(self) -> dict[str, Any]:
        return {
            "schemaVersion": SCHEMA_VERSION,
            "verdict": self.verdict,
            "exitCode": self.exit_code,
            "summary": self.summary(),
            "suite": self.suite,
            "dtype": self.dtype,
            "device": self.device,
            "runtimeVersion": self.runtime_version,
            "shapes": self.shapes,
            "modelShape": self.model_shape,
            "fault": self.fault,
            "kernelConfig": self.kernel_config,
            "error": self.error_text,
            "durations": self.durations,
            "peakGpuMemoryBytes": self.peak_gpu_memory_bytes,
            "environment": self.environment,
            "checks": [c.to_json() for c in self.checks],
            "layerStats": self.layer_stats,
        }

    def to_compact(self) -> str:
        """The compact JSON (UTF-8), within the termination message's bound and parseable."""
        return build_report(
            CompactReport(
                verdict=self.verdict,
                summary=self.summary(),
                failing=tuple(
                    FailingEntry(c.name, c.op, c.detail or f"{c.metric}={c.value} > {c.threshold}")
                    for c in self.failing
                ),
                suite=self.suite,
                dtype=self.dtype,
                device=self.device,
                runtime_version=self.runtime_version,
                error=self.error_text,
            )
        )
