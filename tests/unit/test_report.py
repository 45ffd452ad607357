"""The compact report parser is strict: anything but a v1 report is an error, never a pass."""

from __future__ import annotations

import json

import pytest
from clef_builders import KEY_BAND_FAILURE, report

from clef_contract.report import ReportInvalid, ReportMissing, parse_report


def test_passing_report_parses():
    r = parse_report(report())
    assert r.verdict == "pass" and r.suite == "kernels" and r.dtype == "f16" and r.failing == ()


def test_failing_report_keeps_the_checks():
    r = parse_report(report("fail", failing=KEY_BAND_FAILURE))
    assert r.failing[0].op == "causal_conv1d"
    assert "key channel band" in r.failing[0].detail


@pytest.mark.parametrize("message", [None, "", "   \n"])
def test_missing(message):
    with pytest.raises(ReportMissing):
        parse_report(message)


def _mutated(**changes):
    body = json.loads(report())
    for k, v in changes.items():
        if v is KeyError:
            body.pop(k)
        else:
            body[k] = v
    return json.dumps(body)


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("panic: CUDA error", "not JSON"),
        ("[1, 2]", "JSON object"),
        (_mutated(schemaVersion="clef.riotpiao.com/verify-report/v2"), "schemaVersion"),
        (_mutated(verdict="passed"), "verdict"),
        (_mutated(verdict="fail"), "no failing check"),
        (_mutated(verdict="error"), "no reason"),
        (_mutated(summary=KeyError), "lacks summary"),
        (_mutated(extra="x"), "unknown fields extra"),
        (_mutated(failing="none"), "must be a list"),
        (_mutated(failing=[{"name": "x", "op": 1, "detail": ""}]), "failing[0]"),
        (_mutated(error=3), "'error'"),
        (_mutated(dtype=None), "'dtype'"),
        (_mutated(failing=KEY_BAND_FAILURE), "says pass but"),
        (report(summary="x" * 5000), "more than 4096"),
    ],
)
def test_invalid(message, words):
    with pytest.raises(ReportInvalid, match=None) as exc:
        parse_report(message)
    assert words in str(exc.value)
