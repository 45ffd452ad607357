"""The operator↔runtime contract (`clef_contract`): what the runtime builds, the operator parses;
what the operator sends, the runtime accepts; and it has one home, which both images ship."""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from clef_builders import KEY_BAND_FAILURE, make_spec, report

from clef_contract import command
from clef_contract.command import (
    DTYPES,
    SHAPE_FLAG,
    SHAPE_KEYS,
    SUITES,
    ExitCode,
    ShapeError,
    parse_shape,
    shape_flags,
)
from clef_contract.report import (
    FIELDS,
    MAX_FAILING,
    MAX_REPORT_BYTES,
    SCHEMA_VERSION,
    CompactReport,
    FailingEntry,
    ReportInvalid,
    ReportMissing,
    build_report,
    parse_report,
)
from clef_operator.api import Architecture, Dtype, Suite
from clef_operator.render import verify_argv

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "contract" / "clef_contract"

KEY_BAND = FailingEntry(
    "causal_conv1d/prefill: coverage", "causal_conv1d", "causal_conv1d: key channel band [2048, 4096) is zero"
)
PASSED = CompactReport(
    verdict="pass",
    summary="checks 64/64, kernel checks 61/61, token ids 128/128",
    failing=(),
    suite="full",
    dtype="f16",
    device="NVIDIA H200",
    runtime_version="0.1.0",
    error=None,
)
FAILED = replace(PASSED, verdict="fail", summary="FAIL key channel band", failing=(KEY_BAND,))
ERRORED = replace(PASSED, verdict="error", summary="could not run: no GPU", error="no CUDA device")


# ---------------------------------------------------------------------------- builder -> parser


@pytest.mark.parametrize("report", [PASSED, FAILED, ERRORED], ids=["pass", "fail", "error"])
def test_what_the_builder_writes_the_parser_reads_back(report: CompactReport) -> None:
    text = build_report(report)
    assert parse_report(text) == report
    assert list(json.loads(text)) == list(FIELDS)
    assert json.loads(text)["schemaVersion"] == SCHEMA_VERSION


def test_the_builder_names_at_most_the_first_few_failing_checks() -> None:
    many = tuple(FailingEntry(f"check {i}", f"op{i}", f"detail {i}") for i in range(3 * MAX_FAILING))
    parsed = parse_report(build_report(replace(FAILED, failing=many)))
    assert parsed.failing == many[:MAX_FAILING]


def _failing(n: int, detail: str) -> tuple[FailingEntry, ...]:
    return tuple(FailingEntry(f"op{i}/case: rel_rms", f"op{i}", detail) for i in range(n))


@pytest.mark.parametrize(
    "report",
    [
        replace(FAILED, failing=_failing(500, "x" * 5000)),
        replace(FAILED, failing=_failing(3, "x" * 100_000)),
        replace(FAILED, failing=_failing(50, "≤ ∞ 键 " * 300), summary="键" * 5000),
        replace(ERRORED, error="e" * 20_000, summary="s" * 20_000),
        replace(PASSED, device="NVIDIA H200 " * 2000),
        # Kilobytes of op name: only the last resort fits it, and it still keeps the first check.
        replace(FAILED, failing=(replace(KEY_BAND, op="o" * 10_000),)),
    ],
    ids=["many", "long-details", "multibyte", "long-error", "long-device", "long-op"],
)
def test_the_builder_always_fits_the_termination_message_and_parses(report: CompactReport) -> None:
    text = build_report(report)
    assert len(text.encode()) <= MAX_REPORT_BYTES
    parsed = parse_report(text)
    assert (parsed.verdict, parsed.suite, parsed.dtype) == (report.verdict, report.suite, report.dtype)
    if report.verdict == "fail":
        assert parsed.failing[0].op.startswith(report.failing[0].op[:10]), "the first failing check survives"


def test_a_smaller_bound_is_kept_too() -> None:
    text = build_report(replace(FAILED, failing=_failing(20, "y" * 300)), limit=1024)
    assert len(text.encode()) <= 1024 and parse_report(text).failing


# ---------------------------------------------------------------------------------- the parser
# The operator's view: the reports its unit tests feed the planner (clef_builders.report).


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


def _fail(**changes: Any) -> str:
    return _mutated(**{"verdict": "fail", "failing": KEY_BAND_FAILURE, **changes})


ENTRY = KEY_BAND_FAILURE[0]


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("panic: CUDA error", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('"pass"', "JSON object, got str"),
        (_mutated(schemaVersion="clef.riotpiao.com/verify-report/v2"), "schemaVersion"),
        (
            _mutated(schemaVersion="clef.riotpiao.com/verify-report/v0"),
            "is not 'clef.riotpiao.com/verify-report/v1'",
        ),
        (_mutated(schemaVersion=1), "schemaVersion 1 is not"),
        (_mutated(verdict="passed"), "verdict"),
        (_mutated(verdict=True), "'verdict' must be a string, got bool"),
        (_mutated(verdict="FAIL"), "verdict 'FAIL' is not one of pass, fail, error"),
        (_mutated(verdict="fail"), "no failing check"),
        (_mutated(verdict="error"), "no reason"),
        (_mutated(verdict="error", error=""), "says error but gives no reason"),
        (_mutated(summary=KeyError), "lacks summary"),
        (_mutated(schemaVersion=KeyError, verdict=KeyError), "lacks schemaVersion, verdict"),
        (_mutated(extra="x"), "unknown fields extra"),
        (_mutated(exitCode=1), "unknown fields exitCode"),
        (_mutated(failing="none"), "must be a list"),
        (_fail(failing=["x"]), "failing[0] must be an object"),
        (_mutated(failing=[{"name": "x", "op": 1, "detail": ""}]), "failing[0]"),
        (_fail(failing=[ENTRY, {"name": "x", "op": "y"}]), "failing[1]: report field 'detail'"),
        (_mutated(error=3), "'error'"),
        (_mutated(error=["x"]), "'error' must be a string or null"),
        (_mutated(dtype=None), "'dtype'"),
        (_mutated(failing=KEY_BAND_FAILURE), "says pass but"),
        (_mutated(error="boom"), "says pass but"),
        (_fail(summary=None), "'summary' must be a string, got NoneType"),
        (_fail(suite=1), "'suite' must be a string"),
        (_fail(dtype=["f16"]), "'dtype' must be a string"),
        (_fail(device={}), "'device' must be a string"),
        (_fail(runtimeVersion=0.1), "'runtimeVersion' must be a string"),
        (report(summary="x" * 5000), "more than 4096"),
    ],
)
def test_invalid(message, words):
    with pytest.raises(ReportInvalid, match=None) as exc:
        parse_report(message)
    assert words in str(exc.value)


# ------------------------------------------------------------------------ exit codes, flag values


def test_exit_codes() -> None:
    assert [(c.name, int(c)) for c in ExitCode] == [
        ("PASS", 0),
        ("MISMATCH", 1),
        ("COULD_NOT_RUN", 2),
        ("ENGINE_FAILED", 3),  # endpoint-check only: not a verdict of verify's
    ]
    assert [ExitCode.for_verdict(v) for v in ("pass", "fail", "error")] == list(ExitCode)[:3]


def test_the_operator_api_offers_the_suites_and_dtypes_verify_accepts() -> None:
    assert tuple(Suite) == SUITES
    assert tuple(Dtype) == DTYPES


# ------------------------------------------------------------------------------- --shape keys


def test_the_operator_sends_every_shape_key_and_every_key_is_an_architecture_field() -> None:
    fields = set(Architecture.model_fields) - {"preset"}
    assert set(SHAPE_KEYS.values()) == fields


def test_the_rendered_shape_flags_parse_back_to_the_spec() -> None:
    spec = make_spec(
        model={"name": "m", "path": "/m", "architecture": {"numLayers": 8, "linearNumKeyHeads": 8}}
    )
    items = [a.removeprefix(f"{SHAPE_FLAG}=") for a in verify_argv(spec) if a.startswith(f"{SHAPE_FLAG}=")]
    arch = spec.model.architecture
    assert parse_shape(items) == {key: getattr(arch, field) for key, field in SHAPE_KEYS.items()}


def test_shape_flags_need_every_field() -> None:
    fields = {field: 4 for field in SHAPE_KEYS.values()}
    assert len(shape_flags(fields)) == len(SHAPE_KEYS)
    del fields["head_dim"]
    with pytest.raises(KeyError):
        shape_flags(fields)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("heads=3", "KEY one of layers, full_attention_interval"),
        # The runtime used to accept it, the operator never sent it: the conv width is the preset's.
        ("conv_width=4", "KEY one of"),
        ("nokey", "expected KEY=VALUE"),
        ("layers=x", "'x' is not an integer"),
        ("layers=0", "must be at least 1"),
        ("kv_heads=-2", "must be at least 1"),
    ],
)
def test_bad_shape_items_are_rejected(item: str, words: str) -> None:
    with pytest.raises(ShapeError) as exc:
        parse_shape([item])
    assert words in str(exc.value) and repr(item) in str(exc.value)


def test_shape_keys_may_be_spelt_with_dashes() -> None:
    assert parse_shape(["linear-key-heads=16", " kv_heads=4"]) == {"linear_key_heads": 16, "kv_heads": 4}


# ------------------------------------------------------------------------------- one home


def _python_files(*wings: str) -> list[Path]:
    return sorted(p for wing in wings for p in (REPO / wing).rglob("*.py"))


def _code_strings(tree: ast.AST) -> list[str]:
    """String constants in code: docstrings (prose about the names) are left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_seam_has_one_home() -> None:
    names = (
        command.TERMINATION_LOG_ENV,
        command.FAULT_ENV,
        command.DEVICE_ENV,
        command.SHAPES_ENV,
        SHAPE_FLAG,
    )
    # `--shape` but not `--shapes` (the shape profile, a flag of the runtime's own).
    spelt = {name: re.compile(rf"{re.escape(name)}(?!\w)") for name in names}
    files = _python_files("operator", "runtime", "devcluster")
    assert len(files) > 20
    problems = []
    for path in files:
        text = path.read_text()
        where = path.relative_to(REPO)
        if "verify-report/" in text:
            problems.append(f"{where}: names the report schema")
        for s in _code_strings(ast.parse(text)):
            problems += [f"{where}: spells {name} in {s!r}" for name, word in spelt.items() if word.search(s)]
    assert problems == [], "import these from clef_contract instead:\n" + "\n".join(problems)


def test_the_contract_needs_nothing_but_the_standard_library() -> None:
    modules = set()
    for path in _python_files("contract"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    assert "json" in modules, "the scan found the imports"
    foreign = modules - set(sys.stdlib_module_names) - {"clef_contract", "__future__"}
    assert foreign == set()
