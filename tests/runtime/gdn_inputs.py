"""Inputs for the delta-rule tests, shaped and distributed as a GDN layer produces them.

(A plain module beside the tests, imported as ``from gdn_inputs import gdn_inputs``: pytest puts
this directory on ``sys.path`` because it has no ``__init__.py``.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def gdn_inputs(
    rng: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
    *,
    B: int,
    T: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    normalise_qk: bool = False,
) -> tuple[torch.Tensor, ...]:
    """q, k, v in `dtype`; g, beta float32.  g follows the Qwen3.5 gating
    ``-exp(A_log) * softplus(a + dt_bias)`` with its initialisation (A in [1, 16], dt in
    [1e-3, 0.1]): mostly near 0, a tail down to about -5.  With `normalise_qk` q/k arrive
    L2-normalised (for ``use_qk_l2norm=False``: unnormalised keys make the delta rule blow up,
    which no model feeds it)."""
    q = torch.randn(B, T, H, K, generator=rng)
    k = torch.randn(B, T, H, K, generator=rng)
    if normalise_qk:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, generator=rng)
    A_log = torch.log(1 + 15 * torch.rand(HV, generator=rng))
    dt = 1e-3 + (0.1 - 1e-3) * torch.rand(HV, generator=rng)
    dt_bias = torch.log(torch.expm1(dt))  # softplus(dt_bias) = dt
    g = -torch.exp(A_log) * F.softplus(torch.randn(B, T, HV, generator=rng) + dt_bias)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=rng))
    qkv = [t.to(dtype=dtype, device=device) for t in (q, k, v)]
    return (*qkv, g.to(device), beta.to(device))
