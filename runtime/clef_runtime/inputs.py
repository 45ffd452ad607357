"""Seeded inputs of the delta rule, shaped and distributed as a GDN layer produces them: the one
generator behind `verify`'s kernel cases, the bench rows and the kernel tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_inputs(
    gen: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
    *,
    B: int,
    T: int,
    H: int,
    K: int,
    HV: int,
    V: int,
    normalise_qk: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v, g, beta)``: q, k ``[B, T, H, K]`` and v ``[B, T, HV, V]`` in `dtype`; g, beta
    ``[B, T, HV]`` float32, all on `device`.

    Drawn in float32 on the generator's device (a CPU generator gives the same values on every
    machine; a GPU one keeps large inputs off the host), then cast and moved.  g follows the
    Qwen3.5 gating ``-exp(A_log) * softplus(a + dt_bias)`` with its initialisation (A in [1, 16],
    dt in [1e-3, 0.1]): mostly near 0, a tail down to about -5; beta is ``sigmoid`` of a normal.
    With `normalise_qk` q/k arrive L2-normalised (for ``use_qk_l2norm=False``: unnormalised keys
    make the delta rule blow up, which no model feeds it)."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=gen.device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, device=gen.device)

    q = randn(B, T, H, K)
    k = randn(B, T, H, K)
    if normalise_qk:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = randn(B, T, HV, V)
    A_log = torch.log(1 + 15 * rand(HV))
    dt = 1e-3 + (0.1 - 1e-3) * rand(HV)
    dt_bias = torch.log(torch.expm1(dt))  # softplus(dt_bias) = dt
    g = -torch.exp(A_log) * F.softplus(randn(B, T, HV) + dt_bias)
    beta = torch.sigmoid(randn(B, T, HV))
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    return q, k, v, g.to(device), beta.to(device)
