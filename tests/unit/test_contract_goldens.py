"""The compact goldens report (`goldens-report/v1`): what the runtime writes, the operator parses,
and nothing else (clef_contract/goldens.py)."""

from __future__ import annotations

import json

import pytest

from clef_contract.goldens import GoldensReport, build_goldens_report, parse_goldens_report
from clef_contract.report import MAX_REPORT_BYTES, ReportInvalid, ReportMissing

PASS = GoldensReport(
    verdict="pass",
    summary="8 prompts, 576 tokens",
    sha256="sha256:" + "a" * 64,
    bytes=127_000,
    cache_key="sha256:" + "b" * 64,
    provenance={"checkpointDigest": "sha256:" + "c" * 64, "dtype": "f16", "runtimeVersion": "0.1.0"},
    top_k=5,
    prompts=8,
    tokens=576,
)


def test_a_report_round_trips_within_the_bound() -> None:
    text = build_goldens_report(PASS)
    assert len(text.encode()) <= MAX_REPORT_BYTES
    parsed = parse_goldens_report(text)
    assert (parsed.sha256, parsed.bytes, parsed.tokens) == (PASS.sha256, PASS.bytes, PASS.tokens)
    assert parsed.provenance["dtype"] == "f16" and parsed.provenance["gpuClass"] == ""


def test_long_free_text_is_clipped_to_fit() -> None:
    text = build_goldens_report(GoldensReport("error", "", "", 0, "", {}, 0, 0, 0, "x" * 10_000))
    assert len(text.encode()) <= MAX_REPORT_BYTES
    assert parse_goldens_report(text).verdict == "error"


def edited(**changes: object) -> str:
    doc = json.loads(build_goldens_report(PASS))
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (edited(schemaVersion="clef.riotpiao.com/verify-report/v1"), "schemaVersion"),
        (edited(extra=1), "exactly the fields"),
        (edited(sha256="md5:00"), "sha256"),
        (edited(bytes=0), "sha256"),
        (edited(bytes=-1), "non-negative"),
        (edited(bytes=True), "non-negative"),
        (edited(verdict="maybe"), "verdict"),
        (edited(verdict="error", error=None), "error"),
        ("[]", "JSON object"),
    ],
)
def test_anything_else_is_refused(message: str, why: str) -> None:
    with pytest.raises(ReportInvalid, match=why):
        parse_goldens_report(message)


def test_no_message_is_a_missing_report() -> None:
    with pytest.raises(ReportMissing):
        parse_goldens_report("")
