"""The compact verification report, read from the verification pod's termination message.

The parser is strict on purpose: the operator is fail-closed, so anything that is not exactly a
`clef.riotpiao.com/verify-report/v1` compact report (docs/architecture.md, "The report") is an
error, never a pass.  It lives here rather than being imported from clef_runtime because the
operator image carries no torch, no Triton and no runtime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clef_operator.api import REPORT_SCHEMA_VERSION

MAX_REPORT_BYTES = 4096
VERDICTS = ("pass", "fail", "error")
_FIELDS = {
    "schemaVersion",
    "verdict",
    "summary",
    "failing",
    "suite",
    "dtype",
    "device",
    "runtimeVersion",
    "error",
}


class ReportMissing(ValueError):
    """The pod left no termination message."""


class ReportInvalid(ValueError):
    """The termination message is not a valid compact report."""


@dataclass(frozen=True)
class FailingEntry:
    name: str
    op: str
    detail: str


@dataclass(frozen=True)
class CompactReport:
    verdict: str
    summary: str
    failing: tuple[FailingEntry, ...]
    suite: str
    dtype: str
    device: str
    runtime_version: str
    error: str | None


def _string(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ReportInvalid(f"report field {key!r} must be a string, got {type(value).__name__}")
    return value


def parse_report(message: str | None) -> CompactReport:
    """Parse a termination message; raise ReportMissing or ReportInvalid saying what is wrong."""
    if message is None or not message.strip():
        raise ReportMissing("the verification pod left no termination message (no compact report)")
    if len(message.encode()) > MAX_REPORT_BYTES:
        raise ReportInvalid(f"report is {len(message.encode())} bytes, more than {MAX_REPORT_BYTES}")
    try:
        obj = json.loads(message)
    except json.JSONDecodeError as exc:
        snippet = message.strip().splitlines()[0][:120]
        raise ReportInvalid(f"termination message is not JSON ({exc.msg}): {snippet!r}") from None
    if not isinstance(obj, dict):
        raise ReportInvalid(f"report must be a JSON object, got {type(obj).__name__}")
    missing = sorted(_FIELDS - obj.keys())
    if missing:
        raise ReportInvalid(f"report lacks {', '.join(missing)}")
    unknown = sorted(obj.keys() - _FIELDS)
    if unknown:
        raise ReportInvalid(f"report has unknown fields {', '.join(unknown)} for {REPORT_SCHEMA_VERSION}")
    if obj["schemaVersion"] != REPORT_SCHEMA_VERSION:
        raise ReportInvalid(f"report schemaVersion {obj['schemaVersion']!r} is not {REPORT_SCHEMA_VERSION!r}")
    verdict = _string(obj, "verdict")
    if verdict not in VERDICTS:
        raise ReportInvalid(f"report verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    failing_raw = obj["failing"]
    if not isinstance(failing_raw, list):
        raise ReportInvalid("report field 'failing' must be a list")
    failing = []
    for i, entry in enumerate(failing_raw):
        if not isinstance(entry, dict):
            raise ReportInvalid(f"report failing[{i}] must be an object")
        try:
            failing.append(
                FailingEntry(_string(entry, "name"), _string(entry, "op"), _string(entry, "detail"))
            )
        except ReportInvalid as exc:
            raise ReportInvalid(f"report failing[{i}]: {exc}") from None
    error = obj["error"]
    if error is not None and not isinstance(error, str):
        raise ReportInvalid("report field 'error' must be a string or null")
    if verdict == "pass" and (failing or error):
        raise ReportInvalid("report says pass but lists failing checks or an error")
    if verdict == "fail" and not failing:
        raise ReportInvalid("report says fail but lists no failing check")
    if verdict == "error" and not error:
        raise ReportInvalid("report says error but gives no reason in 'error'")
    return CompactReport(
        verdict=verdict,
        summary=_string(obj, "summary"),
        failing=tuple(failing),
        suite=_string(obj, "suite"),
        dtype=_string(obj, "dtype"),
        device=_string(obj, "device"),
        runtime_version=_string(obj, "runtimeVersion"),
        error=error,
    )
