"""Triton GDN gating and L2 norm against the float64 references (CPU tier: small shapes; GPU tier:
Qwen3.5 shapes, HV = 32 value heads, q/k with 16 heads of 128)."""

from __future__ import annotations

import pytest
import torch

from clef_runtime import compare
from clef_runtime.faults import ENV_VAR, UnknownFaultError
from clef_runtime.ops.gating import gdn_gating, l2norm
from clef_runtime.opset import get_opset
from clef_runtime.reference import gating as ref
from clef_runtime.tolerances import tolerance


def _close(out: torch.Tensor, expected: torch.Tensor, op: str, dtype_name: str, what: str) -> None:
    compare.assert_close(out, expected, tolerance(op, dtype_name), f"{op} {what} [{dtype_name}]")


def _gating_inputs(randn, shape: tuple[int, ...], dtype: torch.dtype):
    HV = shape[-1]
    # a + dt_bias spans softplus' linear, curved and exponential regions; b spans sigmoid's.
    return (
        randn(*shape, dtype=dtype, scale=4.0),
        randn(*shape, dtype=dtype, scale=4.0),
        randn(HV, scale=1.0),  # A_log: decay rates exp(A_log) around 1
        randn(HV, scale=1.0),
    )


# --- gdn_gating ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 37, 12), (5, 32)], ids=["B2-T37-HV12", "rows5-HV32"])
def test_gating_matches_reference(shape: tuple[int, ...], dtype: torch.dtype, dtype_name: str, randn) -> None:
    a, b, A_log, dt_bias = _gating_inputs(randn, shape, dtype)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32 and g.shape == beta.shape == a.shape
    _close(g, g_ref, "gdn_gating", dtype_name, "g")
    _close(beta, beta_ref, "gdn_gating", dtype_name, "beta")
    assert (g <= 0).all(), "g is a log-decay: never positive"


def test_gating_parameters_in_low_precision(randn) -> None:
    """A_log and dt_bias as stored by a bf16 checkpoint; the math still runs in float32."""
    a, b, A_log, dt_bias = _gating_inputs(randn, (3, 16), torch.bfloat16)
    A_log, dt_bias = A_log.bfloat16(), dt_bias.bfloat16()
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    _close(g, g_ref, "gdn_gating", "f32", "g")
    _close(beta, beta_ref, "gdn_gating", "f32", "beta")


# The interpreter evaluates sigmoid's exp(-b) in numpy, which warns when it overflows to inf;
# the result (1 / (1 + inf) = 0) is the right one, as on a GPU.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_gating_is_accurate_at_extremes(device) -> None:
    """softplus: x for large x (no overflow), exp(x) for very negative x (no cancellation to 0);
    sigmoid saturates to exactly 0 and 1 without NaN.  Checked element by element, not in norm."""
    xs = [-100.0, -30.0, -10.0, -5.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 5.0, 10.0, 19.0, 21.0, 30.0, 100.0, 1e4]
    a = torch.tensor([xs], device=device)
    zeros = torch.zeros(len(xs), device=device)
    g, beta = gdn_gating(a, a, zeros, zeros)
    g_ref, beta_ref = ref.gdn_gating(a, a, zeros, zeros)
    assert torch.isfinite(g).all() and torch.isfinite(beta).all()
    rel = ((g.double() - g_ref.double()) / g_ref.double().abs()).abs()
    assert rel.max() < 1e-5, f"softplus relative error {rel.max():.2e} at a={xs[int(rel.argmax())]}"
    assert torch.equal(beta.cpu()[0, [0, -1]], torch.tensor([0.0, 1.0]))
    assert (beta.double() - beta_ref.double()).abs().max() < 1e-6


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (
            lambda r: (r(2, 32), r(2, 32), r(16), r(32)),
            ValueError,
            r"gdn_gating: A_log has 16 heads but a has 32 \(a, b are \[\.\.\., HV\], A_log and dt_bias \[HV\]\)",
        ),
        (lambda r: (r(2, 32), r(2, 32), r(32), r(31)), ValueError, "dt_bias has 31 heads but a has 32"),
        (lambda r: (r(2, 32), r(3, 32), r(32), r(32)), ValueError, r"b is \[3, 32\] but a is \[2, 32\]"),
        (lambda r: (r(32, 2).t(), r(2, 32), r(32), r(32)), ValueError, "a .* is not contiguous"),
        (lambda r: (r(2, 32).double(), r(2, 32), r(32), r(32)), TypeError, "a has dtype float64"),
        (lambda r: (r(2, 32), r(2, 32), r(1, 32), r(32)), ValueError, "A_log must have 1 dims"),
    ],
    ids=["A_log-heads", "dt_bias-heads", "b-shape", "a-strided", "a-f64", "A_log-2d"],
)
def test_gating_rejects_bad_input(args, error, match, randn) -> None:
    with pytest.raises(error, match=match):
        gdn_gating(*args(randn))


def test_fault_beta_no_sigmoid(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    a, b, A_log, dt_bias = _gating_inputs(randn, (4, 12), torch.float16)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    monkeypatch.setenv(ENV_VAR, "beta_no_sigmoid")
    g, beta = get_opset("triton").gdn_gating(a, b, A_log, dt_bias)
    assert torch.equal(beta, b.float()), "beta must be the raw logit b"
    _close(g, g_ref, "gdn_gating", "f16", "g under the beta fault")
    monkeypatch.delenv(ENV_VAR)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    _close(beta, beta_ref, "gdn_gating", "f16", "beta, fault unset")


def test_fault_decay_sign_flipped(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    a, b, A_log, dt_bias = _gating_inputs(randn, (4, 12), torch.bfloat16)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    monkeypatch.setenv(ENV_VAR, "decay_sign_flipped")
    g, beta = get_opset("triton").gdn_gating(a, b, A_log, dt_bias)
    assert (g >= 0).all()
    _close(g, -g_ref, "gdn_gating", "bf16", "g under the sign fault")
    _close(beta, beta_ref, "gdn_gating", "bf16", "beta under the sign fault")
    monkeypatch.delenv(ENV_VAR)
    g, _ = gdn_gating(a, b, A_log, dt_bias)
    _close(g, g_ref, "gdn_gating", "bf16", "g, fault unset")


def test_gating_unknown_fault_raises(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    monkeypatch.setenv(ENV_VAR, "beta-no-sigmoid")
    with pytest.raises(UnknownFaultError, match="beta-no-sigmoid"):
        get_opset("triton").gdn_gating(*_gating_inputs(randn, (2, 8), torch.float32))


# --- l2norm -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 9, 4, 128), (7, 96), (3, 5)], ids=["q-heads-128", "K96", "K5"])
def test_l2norm_matches_reference(shape: tuple[int, ...], dtype: torch.dtype, dtype_name: str, randn) -> None:
    x = randn(*shape, dtype=dtype, scale=3.0)
    y = l2norm(x)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, ref.l2norm(x), "l2norm", dtype_name, str(shape))


def test_l2norm_zero_row_and_eps(randn) -> None:
    x = randn(4, 64)
    x[1] = 0.0
    y = l2norm(x, eps=1e-3)
    assert torch.isfinite(y).all() and not y[1].any()
    _close(y, ref.l2norm(x, eps=1e-3), "l2norm", "f32", "eps=1e-3")


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda r: r(64, 4).t(), ValueError, r"l2norm: x \[4, 64\] is not contiguous"),
        (lambda r: r(4, 8).to(torch.int32), TypeError, "x has dtype int32"),
        (lambda r: r(2, 20000), ValueError, "rows of 20000 elements are longer than the supported"),
    ],
    ids=["strided", "int", "too-long"],
)
def test_l2norm_rejects_bad_input(make, error, match, randn) -> None:
    with pytest.raises(error, match=match):
        l2norm(make(randn))


# --- GPU tier -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "T"), [(1, 4096), (8, 4096), (256, 1)])
def test_gpu_gating_qwen_shapes(
    B: int, T: int, dtype: torch.dtype, dtype_name: str, randn, gpu_device
) -> None:
    a = randn(B, T, 32, dtype=dtype, scale=4.0, on=gpu_device)
    b = randn(B, T, 32, dtype=dtype, scale=4.0, on=gpu_device)
    A_log, dt_bias = randn(32, on=gpu_device), randn(32, on=gpu_device)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    _close(g, g_ref, "gdn_gating", dtype_name, f"g B={B} T={T}")
    _close(beta, beta_ref, "gdn_gating", dtype_name, f"beta B={B} T={T}")


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "T"), [(1, 4096), (8, 4096), (256, 1)])
def test_gpu_l2norm_qwen_shapes(
    B: int, T: int, dtype: torch.dtype, dtype_name: str, randn, gpu_device
) -> None:
    x = randn(B, T, 16, 128, dtype=dtype, scale=3.0, on=gpu_device)
    _close(l2norm(x), ref.l2norm(x), "l2norm", dtype_name, f"B={B} T={T}")
