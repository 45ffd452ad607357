"""GDN gating (log-decay ``g`` and write strength ``beta``) and the L2 norm of q/k heads.

Both are row-wise and memory bound: a program owns a ``[BLOCK_M, BLOCK_N]`` tile of rows (heads
for gating, the head dimension for the norm), reads it once, computes in float32 and writes once.
Per-head parameters (``A_log``, ``dt_bias``) are loaded once per program as a row vector.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from clef_runtime.ops._common import (
    MAX_ROW,
    cdiv,
    check_runnable,
    check_tensor,
    row_tile,
    shape_str,
    softplus,
)


@triton.jit
def _gdn_gating_kernel(
    a_ptr,
    b_ptr,
    A_log_ptr,
    dt_bias_ptr,
    g_ptr,
    beta_ptr,
    M,
    HV,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.arange(0, BLOCK_H)
    h_ok = h < HV
    ok = (rows < M)[:, None] & h_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * HV + h[None, :]
    decay_rate = tl.exp(tl.load(A_log_ptr + h, mask=h_ok, other=0.0).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + h, mask=h_ok, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    g = -(decay_rate[None, :] * softplus(a + dt_bias[None, :]))
    tl.store(g_ptr + offs, g, mask=ok)
    b = tl.load(b_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(beta_ptr + offs, tl.sigmoid(b), mask=ok)


@triton.jit
def _l2norm_kernel(
    x_ptr,
    y_ptr,
    M,
    K,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    ok = (rows < M)[:, None] & (k < K)[None, :]
    offs = rows.to(tl.int64)[:, None] * K + k[None, :]
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=1) + eps)
    tl.store(y_ptr + offs, (x * inv[:, None]).to(y_ptr.dtype.element_ty), mask=ok)


def gdn_gating(
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See `clef_runtime.opset.OpSet.gdn_gating`: ``g = -exp(A_log) * softplus(a + dt_bias)``,
    ``beta = sigmoid(b)``, both float32 ``[..., HV]``."""
    op = "gdn_gating"
    check_tensor(op, "a", a, layout="[..., HV]")
    if a.dim() < 1:
        raise ValueError(f"{op}: a must be [..., HV], got a scalar")
    check_tensor(op, "b", b, device=a.device, layout="[..., HV]")
    if b.shape != a.shape:
        raise ValueError(f"{op}: b is {shape_str(b)} but a is {shape_str(a)}; both are [..., HV]")
    HV = a.shape[-1]
    for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(op, name, p, ndim=1, device=a.device, layout="[HV]")
        if p.shape[0] != HV:
            raise ValueError(
                f"{op}: {name} has {p.shape[0]} heads but a has {HV} (a, b are [..., HV], A_log and dt_bias [HV])"
            )
    check_runnable(op, a.device)

    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    M = a.numel() // HV if HV else 0
    if M == 0:
        return g, beta
    block_m, block_h, num_warps = row_tile(M, HV)
    _gdn_gating_kernel[(cdiv(M, block_m),)](
        a,
        b,
        A_log,
        dt_bias,
        g,
        beta,
        M,
        HV,
        BLOCK_M=block_m,
        BLOCK_H=block_h,
        num_warps=num_warps,
    )
    return g, beta


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """See `clef_runtime.opset.OpSet.l2norm`: ``x * rsqrt(sum(x^2, -1) + eps)`` in float32,
    returned in x's dtype."""
    op = "l2norm"
    check_tensor(op, "x", x, layout="[..., K]")
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., K], got a scalar")
    K = x.shape[-1]
    if K > MAX_ROW:
        raise ValueError(f"{op}: rows of {K} elements are longer than the supported {MAX_ROW}")
    if not eps >= 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    check_runnable(op, x.device)

    y = torch.empty_like(x)
    M = x.numel() // K if K else 0
    if M == 0:
        return y
    block_m, block_k, num_warps = row_tile(M, K)
    _l2norm_kernel[(cdiv(M, block_m),)](
        x, y, M, K, float(eps), BLOCK_M=block_m, BLOCK_K=block_k, num_warps=num_warps
    )
    return y


__all__ = ["gdn_gating", "l2norm"]
