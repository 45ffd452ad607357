"""Gated RMSNorm: RMSNorm(x) * weight * silu(z)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clef_runtime.reference.common import REF_DTYPE


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x64 = x.to(REF_DTYPE)
    normed = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps)
    return (normed * weight.to(REF_DTYPE) * F.silu(z.to(REF_DTYPE))).to(x.dtype)
