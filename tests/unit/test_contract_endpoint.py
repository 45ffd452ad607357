"""The compact endpoint report (`endpoint-report/v3`): what endpoint-check leaves in the termination
log for the operator.  Same family as verify's: bounded, shrunk rather than cut, parsed strictly."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clef_contract.endpoint import (
    ENDPOINT_SCHEMA_VERSION,
    Divergence,
    EndpointReport,
    EngineFailure,
    build_endpoint_report,
    parse_endpoint_report,
)
from clef_contract.report import MAX_REPORT_BYTES, CompactReport, FailingEntry, ReportInvalid, ReportMissing

KEY_BAND = Divergence("chat-65", 0, 1234, " Mercury", 0, "!", None, False)
FAILED = EndpointReport(
    compact=CompactReport(
        verdict="fail",
        summary="FAIL prompt chat-65, position 0: expected 1234 ' Mercury', got 0 '!'",
        failing=(FailingEntry("prompt chat-65: token ids", "endpoint", "position 0: got 0, expected 1234"),),
        suite="endpoint",
        dtype="f16",
        device="clef-flash at http://preview:8000",
        runtime_version="0.1.0",
        error=None,
    ),
    dialect="candle-vllm",
    logprobs="placeholder",
    first_divergence=KEY_BAND,
    goldens_sha256="sha256:" + "a" * 64,
)


def test_round_trip() -> None:
    text = build_endpoint_report(FAILED)
    assert json.loads(text)["schemaVersion"] == ENDPOINT_SCHEMA_VERSION
    assert parse_endpoint_report(text) == FAILED


def test_a_pass_may_name_a_near_tie() -> None:
    near = replace(KEY_BAND, got_id=1235, got_text=" Venus", golden_margin=0.12, near_tie=True)
    passed = replace(
        FAILED, compact=replace(FAILED.compact, verdict="pass", failing=()), first_divergence=near
    )
    assert parse_endpoint_report(build_endpoint_report(passed)).first_divergence == near


def test_many_long_failures_fit_and_keep_the_first_divergence() -> None:
    failing = tuple(FailingEntry(f"prompt p{i}: token ids", "endpoint", "x" * 900) for i in range(30))
    long_text = replace(KEY_BAND, expected_text="y" * 5000, got_text="z" * 5000, prompt="p" * 500)
    report = replace(
        FAILED,
        compact=replace(FAILED.compact, failing=failing, summary="s" * 9000),
        first_divergence=long_text,
    )
    for limit in (MAX_REPORT_BYTES, 1024):
        text = build_endpoint_report(report, limit=limit)
        assert len(text.encode()) <= limit
        parsed = parse_endpoint_report(text)
        assert parsed.compact.failing and parsed.first_divergence is not None
        assert parsed.first_divergence.position == 0 and parsed.first_divergence.got_id == 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.__setitem__("suite", "kernels"), "suite"),
        (lambda d: d.__setitem__("dialect", "tgi"), "dialect"),
        (lambda d: d.__setitem__("logprobs", "some"), "logprobs"),
        (lambda d: d.pop("firstDivergence"), "lacks firstDivergence"),
        (lambda d: d["firstDivergence"].pop("gotId"), "exactly"),
        (lambda d: d["firstDivergence"].__setitem__("position", "0"), "position"),
        (lambda d: d["firstDivergence"].__setitem__("goldenMargin", "small"), "goldenMargin"),
        (lambda d: d.__setitem__("schemaVersion", "clef.riotpiao.com/verify-report/v1"), "schemaVersion"),
        (lambda d: d.__setitem__("failing", []), "fail but lists no failing"),
    ],
)
def test_the_parser_refuses_anything_else(edit, message: str) -> None:
    doc = json.loads(build_endpoint_report(FAILED))
    edit(doc)
    with pytest.raises(ReportInvalid, match=message):
        parse_endpoint_report(json.dumps(doc))


def test_no_message_is_missing() -> None:
    with pytest.raises(ReportMissing):
        parse_endpoint_report("")


def test_an_error_report_may_name_an_unknown_dialect() -> None:
    error = replace(
        FAILED,
        compact=replace(FAILED.compact, verdict="error", failing=(), error="dialect 'tgi' is not one of ..."),
        dialect="tgi",
        first_divergence=None,
    )
    assert parse_endpoint_report(build_endpoint_report(error)).dialect == "tgi"


def test_the_report_names_the_goldens_it_read() -> None:
    """Issue 33, finding 1: a pass or a fail names the goldens digest; an error before any goldens
    were read may not."""
    doc = json.loads(build_endpoint_report(FAILED))
    assert doc["goldensSha256"] == FAILED.goldens_sha256
    for verdict in ("fail", "pass"):
        bad = {**doc, "verdict": verdict, "goldensSha256": None}
        if verdict == "pass":
            bad["failing"] = []
        with pytest.raises(ReportInvalid, match=f"says {verdict} but names no goldensSha256"):
            parse_endpoint_report(json.dumps(bad))
    for wrong in ("sha256:abc", "md5:" + "a" * 64, 7, "sha256:" + "A" * 64):
        with pytest.raises(ReportInvalid, match="goldensSha256 must be sha256:<64 hex digits> or null"):
            parse_endpoint_report(json.dumps({**doc, "goldensSha256": wrong}))
    error = replace(
        FAILED,
        compact=replace(FAILED.compact, verdict="error", failing=(), error="cannot read"),
        first_divergence=None,
        goldens_sha256=None,
    )
    assert parse_endpoint_report(build_endpoint_report(error)).goldens_sha256 is None


def test_a_v1_report_without_the_goldens_digest_is_refused() -> None:
    doc = json.loads(build_endpoint_report(FAILED))
    del doc["goldensSha256"]
    doc["schemaVersion"] = "clef.riotpiao.com/endpoint-report/v1"
    with pytest.raises(ReportInvalid, match="lacks goldensSha256"):
        parse_endpoint_report(json.dumps(doc))


ENGINE_DIED = replace(
    FAILED,
    compact=replace(FAILED.compact, verdict="error", failing=(), error="the engine failed prompt tokens-1"),
    first_divergence=None,
    engine_error=EngineFailure("tokens-1", "POST /v1/completions: HTTP 500: " + "x" * 5000),
)


def test_an_engine_error_names_the_prompt_and_a_bounded_message() -> None:
    """Issue 38, item 5: the engine's own failure travels as its own field."""
    text = build_endpoint_report(ENGINE_DIED)
    assert len(text.encode()) <= MAX_REPORT_BYTES
    parsed = parse_endpoint_report(text)
    assert parsed.engine_error is not None and parsed.engine_error.prompt == "tokens-1"
    assert parsed.engine_error.message.startswith("POST /v1/completions: HTTP 500: x")
    assert parse_endpoint_report(build_endpoint_report(FAILED)).engine_error is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("engineError"), "lacks engineError"),
        (lambda d: d.__setitem__("engineError", "HTTP 500"), "engineError must be null or an object"),
        (lambda d: d["engineError"].pop("message"), "exactly prompt, message"),
        (lambda d: d["engineError"].__setitem__("prompt", ""), "non-empty"),
        (lambda d: d.update(verdict="pass", error=None), "says pass but names an engineError"),
    ],
)
def test_the_parser_refuses_a_malformed_engine_error(edit, message: str) -> None:
    doc = json.loads(build_endpoint_report(ENGINE_DIED))
    edit(doc)
    with pytest.raises(ReportInvalid, match=message):
        parse_endpoint_report(json.dumps(doc))
