"""Triton gated RMSNorm against the float64 reference (CPU tier: small shapes; GPU tier: the
Qwen3.5 GDN output norm, 32 value heads of 128)."""

from __future__ import annotations

import pytest
import torch

from clef_runtime import compare
from clef_runtime.faults import ENV_VAR, UnknownFaultError
from clef_runtime.ops.norm import gated_rmsnorm
from clef_runtime.opset import get_opset
from clef_runtime.reference import norm as ref
from clef_runtime.tolerances import tolerance


def _close(out: torch.Tensor, expected: torch.Tensor, dtype_name: str, what: str) -> None:
    compare.assert_close(
        out, expected, tolerance("gated_rmsnorm", dtype_name), f"gated_rmsnorm {what} [{dtype_name}]"
    )


def _inputs(randn, shape: tuple[int, ...], dtype: torch.dtype):
    V = shape[-1]
    return (
        randn(*shape, dtype=dtype, scale=2.0),
        randn(*shape, dtype=dtype, scale=2.0),
        (1.0 + randn(V, scale=0.2)).to(dtype),
    )


@pytest.mark.parametrize("shape", [(2, 9, 4, 128), (37, 96), (3, 1)], ids=["heads-128", "V96", "V1"])
def test_gated_rmsnorm_matches_reference(
    shape: tuple[int, ...], dtype: torch.dtype, dtype_name: str, randn
) -> None:
    x, z, w = _inputs(randn, shape, dtype)
    y = gated_rmsnorm(x, z, w)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, ref.gated_rmsnorm(x, z, w), dtype_name, str(shape))


def test_gated_rmsnorm_mixed_dtypes_and_eps(randn) -> None:
    """f16 activations with a float32 weight and gate (as some checkpoints store them)."""
    x, _, _ = _inputs(randn, (6, 128), torch.float16)
    z, w = randn(6, 128, scale=2.0), 1.0 + randn(128, scale=0.2)
    y = gated_rmsnorm(x, z, w, eps=1e-2)
    assert y.dtype == torch.float16
    _close(y, ref.gated_rmsnorm(x, z, w, eps=1e-2), "f16", "mixed dtypes, eps=1e-2")


def test_fault_gated_norm_no_gate(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    x, z, w = _inputs(randn, (5, 3, 128), torch.float16)
    y_ref = ref.gated_rmsnorm(x, z, w)
    # What the fault computes: the reference with a gate that multiplies by one.
    x64 = x.double()
    no_gate = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).to(x.dtype)
    assert compare.errors(no_gate, y_ref).rel_rms > 0.5

    monkeypatch.setenv(ENV_VAR, "gated_norm_no_gate")
    y = get_opset("triton").gated_rmsnorm(x, z, w)
    _close(y, no_gate, "f16", "under the fault (= RMSNorm(x) * w)")
    monkeypatch.delenv(ENV_VAR)
    _close(gated_rmsnorm(x, z, w), y_ref, "f16", "fault unset")


def test_gated_rmsnorm_unknown_fault_raises(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    monkeypatch.setenv(ENV_VAR, "no_gate")
    with pytest.raises(UnknownFaultError, match="no_gate"):
        get_opset("triton").gated_rmsnorm(*_inputs(randn, (2, 16), torch.float32))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda r: (r(4, 128), r(4, 128), r(64)),
            ValueError,
            r"gated_rmsnorm: weight has 64 elements but rows of x have 128 \(x is \[\.\.\., V\], weight \[V\]\)",
        ),
        (lambda r: (r(4, 128), r(4, 64), r(128)), ValueError, r"z is \[4, 64\] but x is \[4, 128\]"),
        (lambda r: (r(128, 4).t(), r(4, 128), r(128)), ValueError, "x .* is not contiguous"),
        (lambda r: (r(4, 128), r(4, 128).double(), r(128)), TypeError, "z has dtype float64"),
        (lambda r: (r(4, 128), r(4, 128), r(1, 128)), ValueError, "weight must have 1 dims"),
    ],
    ids=["weight-size", "z-shape", "x-strided", "z-f64", "weight-2d"],
)
def test_gated_rmsnorm_rejects_bad_input(make, error, match, randn) -> None:
    with pytest.raises(error, match=match):
        gated_rmsnorm(*make(randn))


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "T"), [(1, 4096), (8, 4096), (256, 1)])
def test_gpu_gated_rmsnorm_qwen_shapes(
    B: int, T: int, dtype: torch.dtype, dtype_name: str, randn, gpu_device
) -> None:
    x = randn(B, T, 32, 128, dtype=dtype, scale=2.0, on=gpu_device)
    z = randn(B, T, 32, 128, dtype=dtype, scale=2.0, on=gpu_device)
    w = (1.0 + randn(128, scale=0.2, on=gpu_device)).to(dtype)
    _close(gated_rmsnorm(x, z, w), ref.gated_rmsnorm(x, z, w), dtype_name, f"B={B} T={T}")
