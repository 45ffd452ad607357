"""GDN gating and the L2 norm, from their formulas."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clef_runtime.reference.common import REF_DTYPE


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    g = -torch.exp(A_log.to(REF_DTYPE)) * F.softplus(a.to(REF_DTYPE) + dt_bias.to(REF_DTYPE))
    beta = torch.sigmoid(b.to(REF_DTYPE))
    return g.float(), beta.float()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x64 = x.to(REF_DTYPE)
    return (x64 / torch.sqrt((x64 * x64).sum(-1, keepdim=True) + eps)).to(x.dtype)
