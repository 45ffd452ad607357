"""What counts as damage: the harness's own bound, not verify's (`clef_runtime.tolerances` is
not used here).

On a triggering scenario (`triggers`), every tensor the caller holds afterwards is compared with
the reference op set's run of the same scenario, per group (head, block), by two errors: the
relative RMS error and the largest absolute error relative to the group's largest reference value.
The clean kernels' errors on the same inputs are the baseline: a mutant does damage when, for some
tensor and either error, it exceeds twice the clean kernels' error plus one unit roundoff of the
dtype (2⁻¹¹ f16, 2⁻⁸ bf16, 2⁻²⁴ f32), or when it is non-finite where the clean run is finite.  So a
whole head 1% off is damage at every dtype (bf16's clean RMS error is ~3e-3), a change of rounding
within twice the clean error is not."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


@dataclass(frozen=True)
class Err:
    rms: float  # worst group's ||d|| / ||ref||
    peak: float  # worst group's max|d| / max|ref|
    finite: bool


def error(t: torch.Tensor, ref: torch.Tensor, groups: tuple[int, ...]) -> Err:
    """Worst-group errors of `t` against `ref` (float64); groups are judged one by one."""
    if t.shape != ref.shape:
        return Err(float("inf"), float("inf"), False)
    a, b = t.detach().double().cpu(), ref.detach().double().cpu()
    finite = bool(torch.isfinite(a).all() or not torch.isfinite(b).all())
    if a.numel() == 0:
        return Err(0.0, 0.0, True)
    rest = [d for d in range(a.dim()) if d not in groups]
    n = 1
    for g in groups:
        n *= a.shape[g]
    a = a.permute(*groups, *rest).reshape(n, -1)
    b = b.permute(*groups, *rest).reshape(n, -1)
    d = torch.nan_to_num(a - b, nan=float("inf"), posinf=float("inf"), neginf=float("inf")).abs()
    tiny = 1e-30
    rms = (d.norm(dim=1) / b.norm(dim=1).clamp_min(tiny)).max().item()
    peak = (d.amax(dim=1) / b.abs().amax(dim=1).clamp_min(tiny)).max().item()
    return Err(rms, peak, finite)


def damaged(mutant: Mapping[str, Err], clean: Mapping[str, Err], dtype: torch.dtype) -> list[str]:
    """The tensors on which the mutant's errors pass the bound, described; empty: no damage."""
    u = UNIT_ROUNDOFF[dtype]
    found = []
    for name, e in mutant.items():
        c = clean[name]
        if c.finite and not e.finite:
            found.append(f"{name}: non-finite")
        elif e.rms > 2 * c.rms + u or e.peak > 2 * c.peak + u:
            found.append(
                f"{name}: rms {e.rms:.3g} (clean {c.rms:.3g}), peak {e.peak:.3g} (clean {c.peak:.3g})"
            )
    return found
