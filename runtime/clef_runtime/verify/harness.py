"""How a kernel case runs one op: on the candidate, then on the reference, and what it checks.

* The reference runs on a **snapshot of the inputs taken before the candidate runs**, so a
  candidate that writes into its inputs (zeroes a band of ``x``, clobbers ``initial_state``)
  cannot hand the reference the same wrong inputs.  Every input the op contract does not name as
  in-place must be bitwise unchanged afterwards (``causal_conv1d: input x was modified``); the
  in-place states (``conv_state``, ``state``) are compared as states, against the reference's own.
* Right after the candidate's first call of an op in a suite run, the op is called once more with
  other inputs of the same shapes (a second layer); the first call's results must not change.  A
  result that is a view of a workspace the next call reuses passes every comparison made right
  after its call and fails this one.
* Errors are measured per group (a value head, a state block, a conv head) and the worst group
  decides (`clef_runtime.compare.worst_group`), with the whole-tensor coverage check
  (`clef_runtime.verify.coverage`) naming dead slices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from clef_runtime.compare import worst_group
from clef_runtime.opset import OpSet
from clef_runtime.tolerances import tolerance
from clef_runtime.verify.coverage import Slice, dead_slices
from clef_runtime.verify.report import Check

SUITE = "kernels"


def _tensors(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def _other_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Inputs of the same shapes, dtypes and contract (g ≤ 0, β in (0, 1), indices as they were)
    but other values: every floating tensor rolled by one element, a fresh copy either way."""
    out: dict[str, Any] = {}
    for name, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            v = v.flatten().roll(1).view_as(v).clone() if v.is_floating_point() else v.clone()
        out[name] = v
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise the same values (NaN where the other has NaN)."""
    return a.shape == b.shape and bool((a == b).logical_or(a.isnan() & b.isnan()).all())


class Case:
    """Runs the ops of one case and collects its checks, timing them together."""

    def __init__(
        self,
        op: str,
        case: str,
        dtype_name: str,
        fast: OpSet,
        ref: OpSet,
        tolerance_scale: float = 1.0,
        rechecked: set[str] | None = None,
    ) -> None:
        self.op, self.case, self.dtype_name = op, case, dtype_name
        self.fast, self.ref = fast, ref
        self.scale = tolerance_scale
        self.checks: list[Check] = []
        self.modified: list[str] = []  # "input x of causal_conv1d (call 2)"
        self.unstable: list[str] = []
        self.calls = 0
        # ops already called a second time (shared across the cases of a suite run: once per op)
        self.rechecked = rechecked if rechecked is not None else set()
        self.start = time.perf_counter()

    @property
    def prefix(self) -> str:
        return f"{self.op}/{self.case}"

    def run(self, op: str, ref_inplace: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        """``op(**kwargs)`` on the candidate, then on the reference with a snapshot of `kwargs`
        taken before.  `ref_inplace` names the in-place arguments (conv_state, state) and gives
        the reference's own tensor for each (a dict of tensors); every other tensor argument must
        come back unchanged."""
        ref_inplace = dict(ref_inplace or {})
        self.calls += 1
        snapshot = {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in kwargs.items()}
        recheck = op not in self.rechecked
        other = _other_inputs(snapshot) if recheck else {}
        out = getattr(self.fast, op)(**kwargs)
        if recheck:
            self.rechecked.add(op)
            results = _tensors(out)
            kept = [t.clone() for t in results]
            getattr(self.fast, op)(**other)
            for i, (t, k) in enumerate(zip(results, kept, strict=True)):
                if not _same(t, k):
                    self.unstable.append(f"result {i} of {op} changed when {op} was called again")
        for name, v in kwargs.items():
            if name in ref_inplace or not isinstance(v, torch.Tensor):
                continue
            if not _same(v, snapshot[name]):
                self.modified.append(f"{op}: input {name} was modified (call {self.calls} of the case)")
        ref_args = {**snapshot, **ref_inplace}
        return out, getattr(self.ref, op)(**ref_args)

    def compare(
        self, what: str, candidate: torch.Tensor, reference: torch.Tensor, *args: Any, **kwargs: Any
    ) -> None:
        """`compare_parts` for one call's tensor."""
        self.compare_parts(what, [("", candidate, reference)], *args, **kwargs)

    def compare_parts(
        self,
        what: str,
        parts: Sequence[tuple[str, torch.Tensor, torch.Tensor]],
        slices: Sequence[Slice] = (),
        groups: Sequence[int] = (),
        group_name: Callable[[int], str] | None = None,
        regroup: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """rel_rms and rel_max of the worst group (every index of the `groups` dims of
        ``regroup(tensor)``; the whole tensor when there are none) against the check's tolerance,
        and coverage over `slices`, over one or several calls (``(label, candidate, reference)``,
        e.g. one per launch configuration): one set of checks, the worst part and group deciding
        and named."""
        if not parts:  # e.g. no launch configuration beyond the other cases' here
            return
        base = tolerance(self.op, self.dtype_name)
        limits = (base.rel_rms * self.scale, base.rel_max * self.scale)
        prefix = f"{self.prefix} {what}"
        worst: list[tuple[float, str]] = [(-1.0, ""), (-1.0, "")]
        finite = True
        dead: list[str] = []
        for label, cand, ref in parts:
            c, r = (regroup(cand), regroup(ref)) if regroup is not None else (cand, ref)
            w = worst_group(c, r, groups)
            finite &= w.finite
            for i, (value, gi) in enumerate(((w.rel_rms, w.rms_group), (w.rel_max, w.max_group))):
                if value > worst[i][0]:
                    names = [label] if label else []
                    if groups and group_name is not None:
                        names.append(group_name(gi))
                    worst[i] = (value, ", ".join(names))
            at = f" at {label}" if label else ""
            found = dead_slices(cand, ref, slices)
            if not w.finite and not found:
                found = [f"{what} has non-finite values"]
            dead.extend(f"{self.op}: {d}{at}" for d in found)
        for metric, (value, where), limit in zip(("rel_rms", "rel_max"), worst, limits, strict=True):
            ok = finite and value <= limit
            detail = "" if ok else f"{prefix}: {metric} {value:.3g} > {limit:g}"
            if not ok and where:
                detail += f" ({where})"
            if not ok and not finite:
                detail += " (non-finite)"
            self.checks.append(Check(f"{prefix}: {metric}", self.op, SUITE, ok, metric, value, limit, detail))
        self._listed(f"{prefix}: coverage", "dead_slices", dead)

    def _listed(self, name: str, metric: str, found: list[str]) -> None:
        detail = "; ".join(found[:4]) + (f"; and {len(found) - 4} more" if len(found) > 4 else "")
        self.checks.append(Check(name, self.op, SUITE, not found, metric, len(found), 0, detail))

    def flag(self, name: str, metric: str, found: list[str]) -> None:
        """A named yes/no check of the case (e.g. "g ≤ 0"): `found` lists what is wrong."""
        self._listed(f"{self.prefix} {name}", metric, found)

    def done(self) -> list[Check]:
        self._listed(f"{self.prefix}: inputs unchanged", "inputs_modified", self.modified)
        self._listed(f"{self.prefix}: results stable across calls", "results_changed", self.unstable)
        elapsed = time.perf_counter() - self.start
        for c in self.checks:
            c.duration_s = round(elapsed / max(len(self.checks), 1), 6)
        return self.checks


class Inputs:
    """Seeded inputs with the statistics of a real GDN layer, drawn on the CPU in float32 so the
    values do not depend on the device, then cast and moved."""

    def __init__(self, seed: int, device: torch.device, dtype: torch.dtype) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.device, self.dtype = device, dtype

    def randn(self, *shape: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen) * scale
        return t.to(device=self.device, dtype=dtype or self.dtype)

    def uniform(self, lo: float, hi: float, *shape: int) -> torch.Tensor:
        t = torch.rand(*shape, generator=self.gen) * (hi - lo) + lo
        return t.to(self.device)

    def gating_params(self, hv: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Like upstream's initialisation: A in (1, 16), dt in (1e-3, 1e-1) through softplus⁻¹.
        A_log = torch.log(self.uniform(1.0, 16.0, hv)).float()
        dt = torch.exp(
            self.uniform(float(torch.log(torch.tensor(1e-3))), float(torch.log(torch.tensor(1e-1))), hv)
        )
        dt_bias = (dt + torch.log(-torch.expm1(-dt))).float()
        return A_log, dt_bias
