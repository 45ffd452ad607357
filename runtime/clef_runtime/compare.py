"""Scale-free error metrics between a candidate tensor and its reference (see `tolerances`)."""

from __future__ import annotations

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


def assert_close(candidate: torch.Tensor, reference: torch.Tensor, tol: Tolerance, what: str = "") -> Errors:
    """Raise AssertionError with both metrics when `candidate` is not within `tol` of `reference`."""
    e = errors(candidate, reference)
    if not e.within(tol):
        raise AssertionError(f"{what or 'tensor'}: {e.describe(tol)}")
    return e
