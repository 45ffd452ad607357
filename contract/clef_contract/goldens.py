"""The compact goldens report (`goldens-report/v1`): what `clef-runtime goldens --out -` says about
the goldens file it printed to stdout, in its termination log.

The operator's goldens Job prints the goldens file (one JSON line) to stdout and this report to the
termination log; the operator reads the pod's log, takes the line whose sha256 and size are the
report's, and stores it (docs/architecture.md, "Goldens").  So the report carries what identifies
the file (``sha256``, ``bytes``, ``cacheKey``) and its provenance (``checkpointDigest``,
``promptSetDigest``, ``runtimeVersion``, ``dtype``, ``opSet``, ``topK``, ``gpuClass``,
``kernelChecks``), plus ``prompts`` and ``tokens`` (how many were recorded).  A ``fail`` or
``error`` verdict carries no file: those fields are empty strings and zeros.

Standard library only; the same 4 KiB bound and fail-closed parsing as verify's report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from clef_contract.report import VERDICTS, ReportInvalid, clip, json_object

GOLDENS_REPORT_SCHEMA: Final = "clef.riotpiao.com/goldens-report/v1"
# `--out -`: the goldens file goes to stdout (nothing else does).
STDOUT: Final = "-"
PROVENANCE_KEYS: Final = (
    "checkpointDigest",
    "promptSetDigest",
    "runtimeVersion",
    "dtype",
    "opSet",
    "gpuClass",
    "kernelChecks",
)
_STRINGS: Final = ("verdict", "summary", "sha256", "cacheKey", *PROVENANCE_KEYS)
_INTS: Final = ("bytes", "topK", "prompts", "tokens")
GOLDENS_REPORT_FIELDS: Final = ("schemaVersion", *_STRINGS, *_INTS, "error")
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class GoldensReport:
    verdict: str  # pass | fail | error
    summary: str
    sha256: str  # "sha256:<hex>" of the file's bytes, as printed (with its final newline)
    bytes: int
    cache_key: str
    provenance: dict[str, str]  # PROVENANCE_KEYS
    top_k: int
    prompts: int
    tokens: int
    error: str | None = None


def build_goldens_report(report: GoldensReport) -> str:
    """The compact JSON, at most MAX_REPORT_BYTES (free text is clipped to fit)."""
    doc: dict[str, Any] = {
        "schemaVersion": GOLDENS_REPORT_SCHEMA,
        "verdict": report.verdict,
        "summary": clip(report.summary, 400),
        "sha256": report.sha256,
        "cacheKey": report.cache_key,
        **{k: clip(str(report.provenance.get(k, "")), 200) for k in PROVENANCE_KEYS},
        "bytes": report.bytes,
        "topK": report.top_k,
        "prompts": report.prompts,
        "tokens": report.tokens,
        "error": None if report.error is None else clip(report.error, 1500),
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def parse_goldens_report(message: str | None) -> GoldensReport:
    """Parse a termination message; ReportMissing or ReportInvalid saying what is wrong."""
    obj = json_object(message)
    if obj.get("schemaVersion") != GOLDENS_REPORT_SCHEMA:
        raise ReportInvalid(f"schemaVersion {obj.get('schemaVersion')!r} is not {GOLDENS_REPORT_SCHEMA!r}")
    if set(obj) != set(GOLDENS_REPORT_FIELDS):
        raise ReportInvalid(f"a goldens report has exactly the fields {', '.join(GOLDENS_REPORT_FIELDS)}")
    for key in _STRINGS:
        if not isinstance(obj[key], str):
            raise ReportInvalid(f"report field {key!r} must be a string")
    for key in _INTS:
        if isinstance(obj[key], bool) or not isinstance(obj[key], int) or obj[key] < 0:
            raise ReportInvalid(f"report field {key!r} must be a non-negative integer")
    if obj["verdict"] not in VERDICTS:
        raise ReportInvalid(f"verdict {obj['verdict']!r} is not one of {', '.join(VERDICTS)}")
    if obj["error"] is not None and not isinstance(obj["error"], str):
        raise ReportInvalid("report field 'error' must be a string or null")
    if obj["verdict"] == "pass" and not (_SHA256.match(obj["sha256"]) and obj["bytes"] > 0):
        raise ReportInvalid("a passing goldens report names the file: sha256:<64 hex> and its size in bytes")
    if obj["verdict"] == "error" and not obj["error"]:
        raise ReportInvalid("an error report must say what the error was")
    return GoldensReport(
        verdict=obj["verdict"],
        summary=obj["summary"],
        sha256=obj["sha256"],
        bytes=obj["bytes"],
        cache_key=obj["cacheKey"],
        provenance={k: obj[k] for k in PROVENANCE_KEYS},
        top_k=obj["topK"],
        prompts=obj["prompts"],
        tokens=obj["tokens"],
        error=obj["error"],
    )
