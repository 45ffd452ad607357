"""The compact endpoint report (`endpoint-report/v3`): `clef-runtime endpoint-check`'s verdict on a
serving engine, for the termination log.

Same family as verify's report (`clef_contract.report`): the same shared fields, the same 4 KiB
bound, the same shrinking builder and the same strict, fail-closed parser; `suite` is always
``"endpoint"`` and `device` names the engine that was asked.  Three fields of its own:

* ``dialect``: how the engine was asked (``clef``, ``vllm``, ``candle-vllm``, ``mistralrs``);
* ``logprobs``: ``"compared"`` when the engine returned real logprobs and they were bounded,
  ``"placeholder"`` when it returned placeholders and only token ids were judged;
* ``firstDivergence``: the first prompt whose ids left the golden's (``null`` when none did):
  prompt, position, expected id and text, got id and text, and the golden's logprob margin
  between the two tokens (``null`` when the engine's token is not in the golden's top-k).
  A divergence at a near-tie is named here too, with ``nearTie: true``, on a passing report;
* ``goldensSha256``: ``sha256:<hex>`` of the goldens file (uncompressed) the check read and
  compared with, ``null`` only when it read none.  A pass always names it: the operator accepts a
  pass only when it is the digest it signed for this goldens key (v2 added it; v1 had none);
* ``engineError``: the engine itself failed a prompt (an HTTP 5xx answer, the connection lost
  mid-request): ``{"prompt", "message"}``, the prompt asked and what the engine said; ``null``
  otherwise.  Only on an ``error`` verdict, which it then explains: not a numeric mismatch, and
  not a check that could not run (v3 added it).

The endpoint-check's command line and environment live here as well, for the operator's Job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from clef_contract.report import (
    FIELDS,
    MAX_REPORT_BYTES,
    CompactReport,
    ReportInvalid,
    clip,
    compact_doc,
    json_object,
    parse_compact,
    shrink_to_fit,
)

ENDPOINT_SCHEMA_VERSION: Final = "clef.riotpiao.com/endpoint-report/v3"
ENDPOINT_SUITE: Final = "endpoint"
DIALECTS: Final = ("clef", "vllm", "candle-vllm", "mistralrs")
LOGPROBS_MODES: Final = ("compared", "placeholder")
ENDPOINT_FIELDS: Final = (*FIELDS, "dialect", "logprobs", "firstDivergence", "goldensSha256", "engineError")
ENGINE_ERROR_FIELDS: Final = ("prompt", "message")
# How much of the engine's own message the compact report keeps.
ENGINE_MESSAGE_WIDTH: Final = 600
DIVERGENCE_FIELDS: Final = (
    "prompt",
    "position",
    "expectedId",
    "expectedText",
    "gotId",
    "gotText",
    "goldenMargin",
    "nearTie",
)

# `clef-runtime endpoint-check` reads these when its flags are absent (the operator's Job sets them).
ENDPOINT_URL_ENV: Final = "CLEF_ENDPOINT_URL"
ENDPOINT_DIALECT_ENV: Final = "CLEF_ENDPOINT_DIALECT"
GOLDENS_ENV: Final = "CLEF_GOLDENS"
GOLDENS_SHA256_ENV: Final = "CLEF_GOLDENS_SHA256"
# The form of a goldens digest, in the Job's argv and in the report.
SHA256_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")

# Token texts are for people; the ids decide.  Bounded so the report keeps its other fields.
_TEXT_WIDTH: Final = 60


@dataclass(frozen=True)
class Divergence:
    prompt: str
    position: int  # index into the generated tokens (0 = the first new token)
    expected_id: int
    expected_text: str
    got_id: int
    got_text: str
    golden_margin: float | None  # golden logprob(expected) - logprob(got); None: got not in top-k
    near_tie: bool


@dataclass(frozen=True)
class EngineFailure:
    """The engine failed a prompt: an HTTP 5xx answer or the connection lost while it answered."""

    prompt: str
    message: str


@dataclass(frozen=True)
class EndpointReport:
    compact: CompactReport  # suite "endpoint"; device: the engine asked
    dialect: str
    logprobs: str
    first_divergence: Divergence | None
    goldens_sha256: str | None = None  # the goldens the check read (None: it read none)
    engine_error: EngineFailure | None = None  # only with verdict "error"


def _divergence_doc(d: Divergence) -> dict[str, Any]:
    return {
        "prompt": clip(d.prompt, _TEXT_WIDTH),
        "position": d.position,
        "expectedId": d.expected_id,
        "expectedText": clip(d.expected_text, _TEXT_WIDTH),
        "gotId": d.got_id,
        "gotText": clip(d.got_text, _TEXT_WIDTH),
        "goldenMargin": None if d.golden_margin is None else round(d.golden_margin, 4),
        "nearTie": d.near_tie,
    }


def build_endpoint_report(report: EndpointReport, limit: int = MAX_REPORT_BYTES) -> str:
    """The compact JSON of `report`, at most `limit` bytes, accepted by `parse_endpoint_report`
    whenever `report` is consistent."""
    doc = compact_doc(report.compact, ENDPOINT_SCHEMA_VERSION)
    doc["dialect"] = clip(report.dialect, 20)
    doc["logprobs"] = report.logprobs
    doc["firstDivergence"] = (
        None if report.first_divergence is None else _divergence_doc(report.first_divergence)
    )
    doc["goldensSha256"] = report.goldens_sha256
    e = report.engine_error
    doc["engineError"] = (
        None
        if e is None
        else {"prompt": clip(e.prompt, _TEXT_WIDTH), "message": clip(e.message, ENGINE_MESSAGE_WIDTH)}
    )
    return shrink_to_fit(doc, limit)


def _parse_engine_error(raw: object, verdict: str) -> EngineFailure | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != set(ENGINE_ERROR_FIELDS):
        raise ReportInvalid(
            f"engineError must be null or an object of exactly {', '.join(ENGINE_ERROR_FIELDS)}"
        )
    if not all(isinstance(raw[k], str) and raw[k] for k in ENGINE_ERROR_FIELDS):
        raise ReportInvalid("engineError.prompt and engineError.message must be non-empty strings")
    if verdict != "error":
        raise ReportInvalid(f"endpoint report says {verdict} but names an engineError")
    return EngineFailure(raw["prompt"], raw["message"])


def _int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportInvalid(f"firstDivergence.{key} must be an integer")
    return value


def _text(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ReportInvalid(f"firstDivergence.{key} must be a string")
    return value


def _parse_divergence(raw: object) -> Divergence | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ReportInvalid("report field 'firstDivergence' must be an object or null")
    if set(raw) != set(DIVERGENCE_FIELDS):
        raise ReportInvalid(f"firstDivergence must have exactly {', '.join(DIVERGENCE_FIELDS)}")
    margin = raw["goldenMargin"]
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, int | float)):
        raise ReportInvalid("firstDivergence.goldenMargin must be a number or null")
    if not isinstance(raw["nearTie"], bool):
        raise ReportInvalid("firstDivergence.nearTie must be a boolean")
    return Divergence(
        prompt=_text(raw, "prompt"),
        position=_int(raw, "position"),
        expected_id=_int(raw, "expectedId"),
        expected_text=_text(raw, "expectedText"),
        got_id=_int(raw, "gotId"),
        got_text=_text(raw, "gotText"),
        golden_margin=None if margin is None else float(margin),
        near_tie=raw["nearTie"],
    )


def parse_endpoint_report(message: str | None) -> EndpointReport:
    """Parse a termination message; raise ReportMissing or ReportInvalid saying what is wrong."""
    obj = json_object(message)
    compact = parse_compact(obj, ENDPOINT_SCHEMA_VERSION, ENDPOINT_FIELDS)
    if compact.suite != ENDPOINT_SUITE:
        raise ReportInvalid(f"endpoint report suite {compact.suite!r} is not {ENDPOINT_SUITE!r}")
    dialect, logprobs = obj["dialect"], obj["logprobs"]
    if dialect not in DIALECTS and compact.verdict != "error":  # a bad --dialect is an error report
        raise ReportInvalid(f"endpoint report dialect {dialect!r} is not one of {', '.join(DIALECTS)}")
    if logprobs not in LOGPROBS_MODES:
        raise ReportInvalid(
            f"endpoint report logprobs {logprobs!r} is not one of {', '.join(LOGPROBS_MODES)}"
        )
    divergence = _parse_divergence(obj["firstDivergence"])
    goldens = obj["goldensSha256"]
    if goldens is not None and (not isinstance(goldens, str) or not SHA256_RE.fullmatch(goldens)):
        raise ReportInvalid("endpoint report goldensSha256 must be sha256:<64 hex digits> or null")
    if goldens is None and compact.verdict != "error":
        raise ReportInvalid(f"endpoint report says {compact.verdict} but names no goldensSha256")
    return EndpointReport(
        compact=compact,
        dialect=dialect,
        logprobs=logprobs,
        first_divergence=divergence,
        goldens_sha256=goldens,
        engine_error=_parse_engine_error(obj["engineError"], compact.verdict),
    )
