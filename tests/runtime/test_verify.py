"""`clef-runtime verify` end to end on the CPU (reduced shapes, Triton interpreter): it passes on the
healthy kernels, fails on every fault of the catalogue naming the right op and check, and exits 2
when it cannot measure anything.  These runs are the same program the verification Job runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clef_contract.report import MAX_REPORT_BYTES as COMPACT_LIMIT_BYTES
from clef_contract.report import SCHEMA_VERSION
from clef_runtime.faults import CATALOGUE
from clef_runtime.verify.report import Check, Report

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    tmp_path: Path, *args: str, fault: str | None = None, env: dict[str, str] | None = None
) -> tuple[int, dict, dict | None, str]:
    """Run `python -m clef_runtime verify ...` as the Job would; return (exit code, full report,
    compact report or None, stderr)."""
    log = tmp_path / "termination-log"
    e = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CLEF_RUNTIME_FAULT", "CLEF_VERIFY_DEVICE", "CLEF_VERIFY_SHAPES", "CLEF_KERNEL_CONFIG")
    }
    e["CLEF_TERMINATION_LOG"] = str(log)
    if fault is not None:
        e["CLEF_RUNTIME_FAULT"] = fault
    e.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "verify", *args],
        capture_output=True,
        text=True,
        env=e,
        cwd=REPO,
        timeout=600,
    )
    full = json.loads(proc.stdout)
    compact = json.loads(log.read_text()) if log.exists() else None
    return proc.returncode, full, compact, proc.stderr


CPU = ("--device", "cpu", "--shapes", "reduced")


def test_kernels_suite_passes_on_healthy_kernels(tmp_path: Path) -> None:
    code, full, compact, err = run_cli(tmp_path, *CPU, "--suite", "kernels", "--dtype", "f16")
    failing = [c["detail"] for c in full["checks"] if not c["passed"]]
    assert code == 0, f"verify failed on healthy kernels: {failing or full['error']}\n{err[-2000:]}"
    assert full["verdict"] == "pass" and compact is not None and compact["verdict"] == "pass"
    assert full["schemaVersion"] == SCHEMA_VERSION
    ops = {c["op"] for c in full["checks"]}
    assert ops >= {
        "causal_conv1d",
        "causal_conv1d_update",
        "gdn_gating",
        "l2norm",
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "gated_rmsnorm",
    }
    # Every op has its error metrics and a coverage check, each with a value and a threshold.
    for c in full["checks"]:
        assert c["metric"] and c["threshold"] is not None, c
    # Nothing forced: the interpreter takes the tensor-core configuration, and says so.
    assert full["kernelConfig"] == "tensor-core" and "kernel config tensor-core" in full["summary"]


@pytest.fixture(scope="module")
def fma_kernels_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    """The kernels suite in f16 with the V100's launch configuration forced through the
    environment, as a verification Job would set it (CLEF_KERNEL_CONFIG)."""
    code, full, _, err = run_cli(
        tmp_path_factory.mktemp("fma"),
        *CPU,
        "--suite",
        "kernels",
        "--dtype",
        "f16",
        env={"CLEF_KERNEL_CONFIG": "fma"},
    )
    return code, full, err


def test_kernels_suite_passes_in_the_v100_configuration(fma_kernels_run: tuple[int, dict, str]) -> None:
    code, full, err = fma_kernels_run
    failing = [c["detail"] for c in full["checks"] if not c["passed"]]
    assert code == 0, f"verify failed in the FMA configuration: {failing or full['error']}\n{err[-2000:]}"
    assert full["kernelConfig"] == "fma (forced)"
    assert "kernel config fma (forced)" in full["summary"]


def test_tolerance_scale_decides_a_check_at_the_edge(fma_kernels_run: tuple[int, dict, str]) -> None:
    """``--tolerance-scale`` (``spec.verification.toleranceScale``) moves the verdict: the check
    nearest its tolerance passes with the tolerances scaled to 1.1× its measured fraction of
    them and fails, named, at 0.9×; the same seed measures the same values every time."""
    from clef_runtime.verify.run import VerifyArgs, run_verify

    _, full, _ = fma_kernels_run
    ratios = [
        (c["value"] / c["threshold"], c["name"])
        for c in full["checks"]
        if c["metric"] in ("rel_rms", "rel_max")
    ]
    assert ratios, "the kernels suite reported no error metrics"
    edge, name = max(ratios)
    # the premise: the edge lies inside the range that --tolerance-scale accepts
    assert 0.9 * edge >= 0.1 and 1.1 * edge <= 100, f"{name} uses {edge:.3g} of its tolerance"

    def run(scale: float) -> Report:
        args = VerifyArgs(
            suite="kernels",
            dtype="f16",
            device="cpu",
            shapes="reduced",
            kernel_config="fma",
            tolerance_scale=scale,
        )
        return run_verify(args)

    above, below = run(1.1 * edge), run(0.9 * edge)
    assert above.verdict == "pass", [c.detail for c in above.failing]
    assert below.verdict == "fail" and below.exit_code == 1
    assert name in [c.name for c in below.failing], [c.name for c in below.failing]


def test_unknown_kernel_config_exits_2(tmp_path: Path) -> None:
    code, full, _, _ = run_cli(tmp_path, *CPU, "--suite", "kernels", "--kernel-config", "sm70")
    assert code == 2 and full["verdict"] == "error"
    assert "'sm70' is not one of auto, fma, tensor-core" in full["error"]


def test_full_suite_passes_and_reports_layer_stats(tmp_path: Path) -> None:
    code, full, compact, err = run_cli(tmp_path, *CPU, "--suite", "full", "--dtype", "f32")
    failing = [c["detail"] for c in full["checks"] if not c["passed"]]
    assert code == 0, f"{failing or full['error']}\n{err[-2000:]}"
    assert "token ids" in full["summary"]
    token = next(c for c in full["checks"] if c["metric"] == "token_ids_equal")
    n = token["value"].split("/")
    assert n[0] == n[1] and int(n[1]) > 0
    assert full["layerStats"], "per-GDN-layer statistics missing"
    row = full["layerStats"][0]
    for key in ("beta_sum", "delta_rule_absmax", "gated_norm_absmax", "conv_absmax_k"):
        assert set(row[key]) == {"candidate", "reference"}
    assert compact is not None and len(json.dumps(compact).encode()) <= COMPACT_LIMIT_BYTES


# Which op and which words the report must name for each fault: the point of the catalogue is
# that each class of silent bug is not just caught but recognisable from the report alone.
EXPECTED = {
    "conv_key_band_zero": ("causal_conv1d", "key channel band"),
    "conv_state_not_advanced": ("causal_conv1d_update", "conv state"),
    "beta_no_sigmoid": ("gdn_gating", "beta"),
    "decay_sign_flipped": ("gdn_gating", "g"),
    "gated_norm_no_gate": ("gated_rmsnorm", "y"),
    "fp16_state_overflow": ("chunk_gated_delta_rule", "non-finite"),
}


def test_expected_table_covers_the_catalogue() -> None:
    assert set(EXPECTED) == set(CATALOGUE)


@pytest.mark.parametrize("fault", sorted(CATALOGUE))
def test_every_fault_is_caught_and_named(tmp_path: Path, fault: str) -> None:
    code, full, compact, err = run_cli(tmp_path, *CPU, "--suite", "kernels", "--dtype", "f16", fault=fault)
    op, words = EXPECTED[fault]
    assert code == 1, f"verify did not fail under {fault}: exit {code}, {full['summary']}\n{err[-2000:]}"
    assert full["verdict"] == "fail" and full["fault"] == fault
    failing = [c for c in full["checks"] if not c["passed"]]
    assert any(c["op"] == op and words in c["detail"] for c in failing), (
        f"{fault}: no failing check on {op} mentioning {words!r}: {[c['detail'] for c in failing]}"
    )
    assert compact is not None and compact["verdict"] == "fail"
    assert any(f["op"] == op for f in compact["failing"])


def test_key_band_fault_is_named_by_range(tmp_path: Path) -> None:
    """The incident, as the report must say it: the band and its channel range, not 'max error'."""
    code, full, compact, _ = run_cli(
        tmp_path, *CPU, "--suite", "full", "--dtype", "f16", fault="conv_key_band_zero"
    )
    assert code == 1
    # reduced shapes: 2 key heads × 16 → q [0, 32), k [32, 64), v [64, 128)
    finding = "causal_conv1d: key channel band [32, 64) is zero"
    assert full["summary"].startswith(f"FAIL {finding}"), full["summary"]
    assert compact is not None and compact["summary"].startswith(f"FAIL {finding}")
    assert finding in compact["failing"][0]["detail"]
    stats = next(c for c in full["checks"] if c["name"] == "model: per-GDN-layer statistics")
    assert not stats["passed"] and "layer 0 (prefill): conv k band absmax is 0" in stats["detail"]


def test_unknown_fault_exits_2(tmp_path: Path) -> None:
    code, full, compact, _ = run_cli(tmp_path, *CPU, "--suite", "kernels", fault="conv_key_band_zeroo")
    assert code == 2 and full["verdict"] == "error"
    assert "not in the fault catalogue" in full["error"]
    assert compact is not None and compact["verdict"] == "error" and compact["error"]


def test_no_gpu_exits_2(tmp_path: Path) -> None:
    # No GPU visible to the verifier, on any host: CUDA_VISIBLE_DEVICES hides a present one.
    env = {"TRITON_INTERPRET": "", "CUDA_VISIBLE_DEVICES": ""}
    code, full, _, _ = run_cli(tmp_path, "--device", "cuda", "--suite", "kernels", env=env)
    assert code == 2 and "no CUDA device" in full["error"]


def test_missing_checkpoint_exits_2(tmp_path: Path) -> None:
    code, full, _, _ = run_cli(tmp_path, *CPU, "--suite", "model", "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 2 and "no config.json" in full["error"]


def test_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps({"model_type": "qwen3_5_text", "linear_num_key_heads": 16, "linear_num_value_heads": 30})
    )
    code, full, _, _ = run_cli(tmp_path, *CPU, "--suite", "kernels", "--config", str(cfg))
    assert code == 2 and "linear_num_value_heads" in full["error"]


def test_bad_dtype_exits_2(tmp_path: Path) -> None:
    code, full, _, _ = run_cli(tmp_path, *CPU, "--dtype", "fp8")
    assert code == 2 and "--dtype" in full["error"]


# ---- the compact report ------------------------------------------------------------------------


def _report_with(n_failing: int, detail_len: int) -> Report:
    r = Report(suite="full", dtype="f16", device="NVIDIA H200 " * 3, runtime_version="0.1.0", shapes="model")
    for i in range(n_failing):
        r.checks.append(
            Check(f"op{i}/case: rel_rms", f"op{i}", "kernels", False, "rel_rms", 1.0, 1e-3, "x" * detail_len)
        )
    r.checks.append(Check("ok", "op", "kernels", True, "rel_rms", 0.0, 1e-3))
    return r


@pytest.mark.parametrize(("n", "length"), [(0, 0), (1, 10), (8, 1000), (500, 5000), (3, 100_000)])
def test_compact_report_always_parses_and_fits(n: int, length: int) -> None:
    r = _report_with(n, length)
    text = r.to_compact()
    assert len(text.encode()) <= COMPACT_LIMIT_BYTES
    doc = json.loads(text)
    assert doc["schemaVersion"] == SCHEMA_VERSION
    assert doc["verdict"] == ("fail" if n else "pass")
    if n:
        assert doc["failing"], "the first failing check must survive the shrinking"


def test_compact_report_with_multibyte_text_fits() -> None:
    r = _report_with(50, 2000)
    for c in r.checks:
        c.detail = "≤ ∞ 键 " * 300
    text = r.to_compact()
    assert len(text.encode()) <= COMPACT_LIMIT_BYTES
    json.loads(text)


def test_no_checks_is_not_a_pass() -> None:
    r = Report(suite="kernels", dtype="f16", device="cpu", runtime_version="0", shapes="reduced")
    assert r.verdict == "error" and r.exit_code == 2


# ---- the architecture the operator passes (--shape) ---------------------------------------------


def test_shape_overrides_reach_the_model_config() -> None:
    from clef_runtime.model.config import FULL, preset
    from clef_runtime.verify.run import _apply_shape, parse_shape

    cfg = _apply_shape(
        preset("qwen3_5"), parse_shape(("layers=8", "full_attention_interval=2", "linear_key_heads=8"))
    )
    assert cfg.num_hidden_layers == 8 and cfg.linear_num_key_heads == 8
    assert [i for i, t in enumerate(cfg.layer_types) if t == FULL] == [1, 3, 5, 7]


def test_every_shape_key_of_the_contract_sets_its_model_config_field() -> None:
    """What the operator sends (every key, the preset's values doubled where the config allows)
    lands in the model the suites run."""
    from clef_contract.command import SHAPE_KEYS
    from clef_runtime.model.config import preset
    from clef_runtime.verify.run import _apply_shape

    base = preset("qwen3_5")
    layout = {"num_layers": 12, "full_attention_interval": 3}
    values = {field: getattr(base, field) * 2 for field in SHAPE_KEYS.values() if field not in layout}
    values |= layout
    cfg = _apply_shape(base, {key: values[field] for key, field in SHAPE_KEYS.items()})
    assert cfg.num_hidden_layers == 12 and len(cfg.full_layers) == 4
    for field in set(SHAPE_KEYS.values()) - set(layout):
        assert getattr(cfg, field) == values[field], field


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("heads=3", "KEY one of"),
        ("linear_key_heads=x", "not an integer"),
        ("head_dim=0", "at least 1"),
        ("nokey", "KEY=VALUE"),
    ],
)
def test_bad_shape_flags_exit_2(tmp_path: Path, item: str, words: str) -> None:
    code, full, _, _ = run_cli(tmp_path, *CPU, "--suite", "kernels", "--shape", item)
    assert code == 2 and words in full["error"]


def test_impossible_shape_exits_2_naming_the_field(tmp_path: Path) -> None:
    code, full, _, _ = run_cli(tmp_path, *CPU, "--suite", "kernels", "--shape", "linear_value_heads=30")
    assert code == 2 and "linear_num_value_heads" in full["error"]


def test_shape_that_contradicts_the_checkpoint_exits_2(tmp_path: Path) -> None:
    from clef_runtime.model.checkpoint import write_random_checkpoint
    from clef_runtime.model.config import preset

    ckpt = write_random_checkpoint(tmp_path / "ckpt", preset("tiny"), seed=1)
    code, full, _, _ = run_cli(
        tmp_path, *CPU, "--suite", "model", "--checkpoint", str(ckpt), "--shape", "linear_key_heads=1"
    )
    assert code == 2 and "disagrees with" in full["error"] and "linear_num_key_heads" in full["error"]


def test_model_suite_runs_a_mounted_checkpoint(tmp_path: Path) -> None:
    """The real-weights path: the checkpoint's own shape, even under the reduced profile."""
    from clef_runtime.model.checkpoint import write_random_checkpoint
    from clef_runtime.model.config import preset

    ckpt = write_random_checkpoint(tmp_path / "ckpt", preset("tiny"), seed=3)
    code, full, _, err = run_cli(
        tmp_path, *CPU, "--suite", "model", "--dtype", "f32", "--checkpoint", str(ckpt)
    )
    assert code == 0, f"{full['summary']}\n{err[-1500:]}"
    assert full["modelShape"]["weights"] == f"checkpoint {ckpt}"


# ---- the harness: snapshots, second calls, per-head errors, launch configurations ---------------


def _conv_case(fast: object) -> list[Check]:
    """One tiny conv call through `harness.Case` (reference on a snapshot, inputs checked)."""
    import torch

    from clef_runtime.reference import REFERENCE_OPS
    from clef_runtime.verify.harness import Case

    gen = torch.Generator().manual_seed(0)
    c = Case("causal_conv1d", "tiny", "f16", fast, REFERENCE_OPS)  # type: ignore[arg-type]
    x = torch.randn(1, 8, 64, generator=gen).half()
    init = torch.randn(1, 64, 3, generator=gen).half()
    (y, _), (ry, _) = c.run(
        "causal_conv1d", x=x, weight=torch.randn(64, 4, generator=gen).half(), initial_state=init,
        output_final_state=True,
    )  # fmt: skip
    c.compare("y", y, ry)
    return c.done()


def test_a_candidate_writing_into_its_input_fails_by_name() -> None:
    """The incident through the input buffer: the reference runs on the snapshot taken before the
    candidate, so it cannot compute the same wrong answer, and the write itself is named."""
    from types import SimpleNamespace

    from clef_runtime.ops import TRITON_OPS

    def zeroing(x, *args, **kw):  # type: ignore[no-untyped-def]
        x[..., 16:32] = 0
        return TRITON_OPS.causal_conv1d(x, *args, **kw)

    checks = {
        c.name: c for c in _conv_case(SimpleNamespace(**{**vars(TRITON_OPS), "causal_conv1d": zeroing}))
    }
    assert checks["causal_conv1d/tiny: inputs unchanged"].detail.startswith(
        "causal_conv1d: input x was modified"
    )
    assert not checks["causal_conv1d/tiny y: rel_rms"].passed
    healthy = _conv_case(TRITON_OPS)
    assert all(c.passed for c in healthy), [c.detail for c in healthy if not c.passed]


def test_a_result_in_a_reused_workspace_fails_the_second_call() -> None:
    from types import SimpleNamespace

    import torch

    from clef_runtime.ops import TRITON_OPS

    workspace: list[torch.Tensor] = []

    def aliased(*args, **kw):  # type: ignore[no-untyped-def]
        y, fin = TRITON_OPS.causal_conv1d(*args, **kw)
        if not workspace:
            workspace.append(torch.empty_like(y))
        workspace[0].copy_(y)
        return workspace[0], fin

    checks = {
        c.name: c for c in _conv_case(SimpleNamespace(**{**vars(TRITON_OPS), "causal_conv1d": aliased}))
    }
    stable = checks["causal_conv1d/tiny: results stable across calls"]
    assert not stable.passed and "changed when causal_conv1d was called again" in stable.detail


def test_one_head_off_is_judged_as_that_head() -> None:
    """1% on one value head of 32 is 0.18% over the whole tensor: the worst head decides."""
    import torch

    from clef_runtime.compare import errors, worst_group

    ref = torch.randn(2, 50, 32, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cand = ref.clone()
    cand[:, :, 31] *= 1.01
    assert errors(cand, ref).rel_rms < 2e-3
    w = worst_group(cand, ref, (2,))
    assert abs(w.rel_rms - 1e-2) < 1e-4 and w.rms_group == 31 and w.finite
    bad = cand.clone()
    bad[0, 0, 5, 0] = float("inf")
    assert not worst_group(bad, ref, (2,)).finite


def test_launch_configurations_are_enumerated_from_the_kernels_choosers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU (no interpreter) at the model's conv width the prefill chooser switches to shorter
    chunks for short prompts, and the suite gets a case for each, found through the chooser
    itself; the decode chooser depends on the channel count only, so the decode cases cover it."""
    import clef_runtime.ops._common as common
    import clef_runtime.ops.conv as conv
    from clef_runtime.verify import configs

    monkeypatch.setattr(conv, "interpreting", lambda: False)
    monkeypatch.setattr(common, "interpreting", lambda: False)
    assert sorted(configs.conv_prefill_tokens(8192, [1000]).values()) == [1, 16]
    assert len(configs.row_tile_rows(32, [2000])) == 7  # BLOCK_M 1 … 64 (2000 rows take 128)
    assert configs.smallest_per_choice(lambda n: n >= 100, [1000, 3, 100, 7]) == {False: 3, True: 100}
