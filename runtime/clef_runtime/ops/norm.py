"""Gated RMSNorm, the GDN layer's output norm: ``RMSNorm(x) * weight * silu(z)`` per value head.

Memory bound (two loads and one store per element): a program owns ``BLOCK_M`` whole rows, so
the mean of squares is a register reduction and every element crosses DRAM exactly once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from clef_runtime.ops._common import MAX_ROW, cdiv, check_runnable, check_tensor, row_tile, shape_str, silu


@triton.jit
def _gated_rmsnorm_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    y_ptr,
    M,
    V,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FAULT_NO_GATE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    v = tl.arange(0, BLOCK_V)
    v_ok = v < V
    ok = (rows < M)[:, None] & v_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * V + v[None, :]
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / V + eps)
    w = tl.load(w_ptr + v, mask=v_ok, other=0.0).to(tl.float32)
    y = x * inv_rms[:, None] * w[None, :]
    if not FAULT_NO_GATE:
        y *= silu(tl.load(z_ptr + offs, mask=ok, other=0.0).to(tl.float32))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


def gated_rmsnorm(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    fault_no_gate: bool = False,
) -> torch.Tensor:
    """See `clef_runtime.opset.OpSet.gated_rmsnorm`: ``x * rsqrt(mean(x^2, -1) + eps) * weight *
    silu(z)`` over the last dim in float32, returned in x's dtype.  ``fault_no_gate`` is the fault
    ``gated_norm_no_gate``, set only by `clef_runtime.ops.faulty`."""
    op = "gated_rmsnorm"
    check_tensor(op, "x", x, layout="[..., V]")
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., V], got a scalar")
    check_tensor(op, "z", z, device=x.device, layout="[..., V]")
    if z.shape != x.shape:
        raise ValueError(f"{op}: z is {shape_str(z)} but x is {shape_str(x)}; the gate has the shape of x")
    V = x.shape[-1]
    check_tensor(op, "weight", weight, ndim=1, device=x.device, layout="[V]")
    if weight.shape[0] != V:
        raise ValueError(
            f"{op}: weight has {weight.shape[0]} elements but rows of x have {V} (x is [..., V], weight [V])"
        )
    if V > MAX_ROW:
        raise ValueError(f"{op}: rows of {V} elements are longer than the supported {MAX_ROW}")
    if not eps >= 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    check_runnable(op, x.device)

    y = torch.empty_like(x)
    M = x.numel() // V if V else 0
    if M == 0:
        return y
    block_m, block_v, num_warps = row_tile(M, V)
    _gated_rmsnorm_kernel[(cdiv(M, block_m),)](
        x,
        z,
        weight,
        y,
        M,
        V,
        float(eps),
        BLOCK_M=block_m,
        BLOCK_V=block_v,
        FAULT_NO_GATE=fault_no_gate,
        num_warps=num_warps,
    )
    return y


__all__ = ["gated_rmsnorm"]
