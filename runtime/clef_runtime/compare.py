"""Scale-free error metrics between a candidate tensor and its reference (see `tolerances`).

`errors` measures a whole tensor; `worst_group` measures every group of it (a value head, a state
block, a conv head) on its own and returns the worst: an error confined to one head of 32 is
diluted √32-fold in the whole-tensor rms, so one head 1% off must be judged as that head."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from clef_runtime.tolerances import Tolerance


@dataclass(frozen=True)
class Errors:
    max_abs: float
    rel_rms: float
    rel_max: float
    finite: bool

    def within(self, tol: Tolerance) -> bool:
        return self.finite and self.rel_rms <= tol.rel_rms and self.rel_max <= tol.rel_max

    def describe(self, tol: Tolerance | None = None) -> str:
        s = f"max_abs={self.max_abs:.3e} rel_rms={self.rel_rms:.3e} rel_max={self.rel_max:.3e}"
        if not self.finite:
            s += " (non-finite values)"
        if tol is not None:
            s += f" (tolerance rel_rms≤{tol.rel_rms:g}, rel_max≤{tol.rel_max:g})"
        return s


def errors(candidate: torch.Tensor, reference: torch.Tensor) -> Errors:
    if candidate.shape != reference.shape:
        raise ValueError(
            f"shape mismatch: candidate {tuple(candidate.shape)} vs reference {tuple(reference.shape)}"
        )
    c = candidate.detach().to(torch.float64).cpu()
    r = reference.detach().to(torch.float64).cpu()
    finite = bool(torch.isfinite(c).all())
    if not finite:
        return Errors(max_abs=float("inf"), rel_rms=float("inf"), rel_max=float("inf"), finite=False)
    d = c - r
    tiny = 1e-30
    max_abs = float(d.abs().max()) if d.numel() else 0.0
    ref_rms = float(r.pow(2).mean().sqrt()) if r.numel() else 0.0
    ref_max = float(r.abs().max()) if r.numel() else 0.0
    rms = float(d.pow(2).mean().sqrt()) if d.numel() else 0.0
    return Errors(
        max_abs=max_abs,
        rel_rms=rms / max(ref_rms, tiny) if rms > 0 else 0.0,
        rel_max=max_abs / max(ref_max, tiny) if max_abs > 0 else 0.0,
        finite=True,
    )


@dataclass(frozen=True)
class WorstGroup:
    """The largest per-group metrics (each may come from a different group) and which groups."""

    rel_rms: float
    rel_max: float
    rms_group: int
    max_group: int
    finite: bool


def _grouped(t: torch.Tensor, group_dims: Sequence[int]) -> torch.Tensor:
    """``t`` as ``[groups, elements]``: the `group_dims` first (flattened), the rest after."""
    dims = [d % t.dim() for d in group_dims]
    rest = [d for d in range(t.dim()) if d not in dims]
    n = 1
    for d in dims:
        n *= t.shape[d]
    return t.permute(*dims, *rest).reshape(n, -1)


def worst_group(candidate: torch.Tensor, reference: torch.Tensor, group_dims: Sequence[int]) -> WorstGroup:
    """Per-group ``rel_rms`` and ``rel_max`` (groups: every index of `group_dims`), computed in
    float64 on the tensors' device; the worst of each.  A group whose reference is exactly zero
    counts as exact when the candidate is zero there too, and as infinitely wrong otherwise."""
    if candidate.shape != reference.shape:
        raise ValueError(
            f"shape mismatch: candidate {tuple(candidate.shape)} vs reference {tuple(reference.shape)}"
        )
    c = _grouped(candidate.detach().to(torch.float64), group_dims)
    r = _grouped(reference.detach().to(device=candidate.device, dtype=torch.float64), group_dims)
    if c.numel() == 0:
        return WorstGroup(0.0, 0.0, 0, 0, True)
    finite_rows = torch.isfinite(c).all(1)
    d = c - r
    rms = d.pow(2).mean(1).sqrt()
    mx = d.abs().amax(1)

    def rel(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        out = num / den.clamp_min(1e-300)
        out = torch.where(num == 0, torch.zeros_like(out), out)
        return torch.where(finite_rows, out, torch.full_like(out, float("inf")))

    rr = rel(rms, r.pow(2).mean(1).sqrt())
    rm = rel(mx, r.abs().amax(1))
    return WorstGroup(
        rel_rms=float(rr.max()),
        rel_max=float(rm.max()),
        rms_group=int(rr.argmax()),
        max_group=int(rm.argmax()),
        finite=bool(finite_rows.all()),
    )


def assert_close(candidate: torch.Tensor, reference: torch.Tensor, tol: Tolerance, what: str = "") -> Errors:
    """Raise AssertionError with both metrics when `candidate` is not within `tol` of `reference`."""
    e = errors(candidate, reference)
    if not e.within(tol):
        raise AssertionError(f"{what or 'tensor'}: {e.describe(tol)}")
    return e
