"""The compact verification report (`verify-report/v1`): its fields, its builder, its parser.

The runtime writes it to the termination log, which Kubernetes caps at 4096 bytes; the operator
reads it back from the pod's termination message.  The builder therefore shrinks (fewer failing
checks, shorter text) until the JSON fits, never cutting the JSON text itself, and it always keeps
what the parser demands (a failing check when the verdict is `fail`).  The parser is strict on
purpose: the operator is fail-closed, so anything that is not exactly a v1 compact report is an
error, never a pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

SCHEMA_VERSION: Final = "clef.riotpiao.com/verify-report/v1"
MAX_REPORT_BYTES: Final = 4096
# The compact report names the first few failing checks; the full report (stdout) has them all.
MAX_FAILING: Final = 8

Verdict = Literal["pass", "fail", "error"]
VERDICTS: Final[tuple[Verdict, ...]] = ("pass", "fail", "error")

FIELDS: Final = (
    "schemaVersion",
    "verdict",
    "summary",
    "failing",
    "suite",
    "dtype",
    "device",
    "runtimeVersion",
    "error",
)
FAILING_FIELDS: Final = ("name", "op", "detail")


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


# ---------------------------------------------------------------------------------- builder


def build_report(report: CompactReport, limit: int = MAX_REPORT_BYTES) -> str:
    """The compact JSON (UTF-8) of `report`: at most `limit` bytes, and accepted by `parse_report`
    whenever `report` itself is consistent (a pass lists nothing failing, a fail at least one
    check, an error its reason)."""
    return shrink_to_fit(compact_doc(report, SCHEMA_VERSION), limit)


def compact_doc(report: CompactReport, schema: str) -> dict[str, Any]:
    """The JSON object of the fields every report of the family shares."""
    return {
        "schemaVersion": schema,
        "verdict": report.verdict,
        "summary": report.summary,
        "failing": [{"name": f.name, "op": f.op, "detail": f.detail} for f in report.failing[:MAX_FAILING]],
        "suite": report.suite,
        "dtype": report.dtype,
        "device": report.device,
        "runtimeVersion": report.runtime_version,
        "error": report.error,
    }


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def _fits(text: str, limit: int) -> bool:
    return len(text.encode()) <= limit


def clip(text: str, n: int) -> str:
    """`text`, or its first n-1 characters and an ellipsis."""
    return text if len(text) <= n else text[: max(n - 1, 0)] + "…"


def _clip_fields(doc: dict[str, Any], keys: Iterable[str], width: int) -> None:
    for key in keys:
        if isinstance(doc.get(key), str):
            doc[key] = clip(doc[key], width)


def shrink_to_fit(doc: dict[str, Any], limit: int) -> str:
    """Shorten free text, then drop failing entries, until the JSON fits in `limit` bytes."""
    text = _dump(doc)
    if _fits(text, limit):
        return text
    _clip_fields(doc, ("summary", "error"), 1000)
    failing: list[dict[str, str]] = doc["failing"]
    for width in (400, 200, 100, 60):
        for entry in failing:
            _clip_fields(entry, ("detail", "name"), width)
        text = _dump(doc)
        if _fits(text, limit):
            return text
    # A `fail` keeps its first (most telling) entry: without one the parser rejects the report.
    keep = 1 if doc["verdict"] == "fail" else 0
    while len(failing) > keep:
        failing.pop()
        text = _dump(doc)
        if _fits(text, limit):
            return text
    _clip_fields(doc, ("summary", "error", "device"), 300)
    text = _dump(doc)
    if _fits(text, limit):
        return text
    # Only pathological inputs (kilobytes of device name or op name) get here: keep the verdict.
    # Fields beyond verify's (another report of the family, e.g. the endpoint report's) are kept
    # as they are: their builders bound them.
    verdict = doc["verdict"]
    first = [{key: clip(value, 60) for key, value in entry.items()} for entry in failing[:keep]]
    return _dump(
        {
            **{key: value for key, value in doc.items() if key not in FIELDS},
            "schemaVersion": doc["schemaVersion"],
            "verdict": verdict,
            "summary": "report truncated to fit the termination message",
            "failing": first,
            "suite": clip(str(doc["suite"]), 20),
            "dtype": clip(str(doc["dtype"]), 8),
            "device": "",
            "runtimeVersion": clip(str(doc["runtimeVersion"]), 40),
            "error": "report truncated" if verdict == "error" else None,
        }
    )


# ----------------------------------------------------------------------------------- parser


def _string(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ReportInvalid(f"report field {key!r} must be a string, got {type(value).__name__}")
    return value


def _failing(raw: object) -> tuple[FailingEntry, ...]:
    if not isinstance(raw, list):
        raise ReportInvalid("report field 'failing' must be a list")
    failing = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ReportInvalid(f"report failing[{i}] must be an object")
        try:
            failing.append(FailingEntry(*(_string(entry, key) for key in FAILING_FIELDS)))
        except ReportInvalid as exc:
            raise ReportInvalid(f"report failing[{i}]: {exc}") from None
    return tuple(failing)


def json_object(message: str | None) -> dict[str, Any]:
    """The termination message as a JSON object within the size bound; ReportMissing or
    ReportInvalid otherwise."""
    if message is None or not message.strip():
        raise ReportMissing("the verification pod left no termination message (no compact report)")
    size = len(message.encode())
    if size > MAX_REPORT_BYTES:
        raise ReportInvalid(f"report is {size} bytes, more than {MAX_REPORT_BYTES}")
    try:
        obj = json.loads(message)
    except json.JSONDecodeError as exc:
        snippet = message.strip().splitlines()[0][:120]
        raise ReportInvalid(f"termination message is not JSON ({exc.msg}): {snippet!r}") from None
    if not isinstance(obj, dict):
        raise ReportInvalid(f"report must be a JSON object, got {type(obj).__name__}")
    return obj


def parse_report(message: str | None) -> CompactReport:
    """Parse a termination message; raise ReportMissing or ReportInvalid saying what is wrong."""
    return parse_compact(json_object(message), SCHEMA_VERSION, FIELDS)


def parse_compact(obj: dict[str, Any], schema: str, fields: tuple[str, ...]) -> CompactReport:
    """The fields every report of the family shares, from a JSON object of schema `schema` whose
    keys must be exactly `fields` (verify's `FIELDS` and any of that schema's own)."""
    missing = sorted(set(fields) - obj.keys())
    if missing:
        raise ReportInvalid(f"report lacks {', '.join(missing)}")
    unknown = sorted(obj.keys() - set(fields))
    if unknown:
        raise ReportInvalid(f"report has unknown fields {', '.join(unknown)} for {schema}")
    if obj["schemaVersion"] != schema:
        raise ReportInvalid(f"report schemaVersion {obj['schemaVersion']!r} is not {schema!r}")
    verdict = _string(obj, "verdict")
    if verdict not in VERDICTS:
        raise ReportInvalid(f"report verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    failing = _failing(obj["failing"])
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
        failing=failing,
        suite=_string(obj, "suite"),
        dtype=_string(obj, "dtype"),
        device=_string(obj, "device"),
        runtime_version=_string(obj, "runtimeVersion"),
        error=error,
    )
