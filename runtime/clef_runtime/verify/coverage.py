"""Coverage: find a slice of an op's output that is dead in the candidate but alive in the reference.

"Max error large" says something is wrong; "key channel band [2048, 4096) is zero" says what.  A
slice is dead when the candidate's values there are all zero, all one constant, or contain
non-finite values, while the reference's are not.  Slices are checked coarse to fine: a whole
band first, then its heads, so one broken band is reported once, not once per head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Slice:
    """A named index range along one axis of a tensor; `children` are checked only if it is alive."""

    label: str
    axis: int
    start: int
    stop: int
    children: tuple[Slice, ...] = ()
    show_range: bool = True

    def describe(self, state: str) -> str:
        where = f" [{self.start}, {self.stop})" if self.show_range else ""
        return f"{self.label}{where} is {state}"

    def take(self, t: torch.Tensor) -> torch.Tensor:
        return t.narrow(self.axis, self.start, self.stop - self.start)


def _state(t: torch.Tensor) -> str | None:
    """Why a slice looks dead, or None when it looks alive."""
    if t.numel() == 0:
        return None
    if not bool(torch.isfinite(t).all()):
        return "non-finite"
    if bool((t == 0).all()):
        return "zero"
    if t.numel() > 1 and bool((t == t.reshape(-1)[0]).all()):
        return "constant"
    return None


def dead_slices(candidate: torch.Tensor, reference: torch.Tensor, slices: Sequence[Slice]) -> list[str]:
    """Descriptions like ``"key channel band [2048, 4096) is zero"`` for every dead slice."""
    found: list[str] = []
    for s in slices:
        cand_state = _state(s.take(candidate))
        ref_state = _state(s.take(reference))
        if cand_state is not None and cand_state != ref_state:
            found.append(s.describe(cand_state))
            continue
        found.extend(dead_slices(candidate, reference, s.children))
    return found


def head_slices(axis: int, heads: int, size: int, what: str) -> tuple[Slice, ...]:
    """One slice per head along `axis`, where each head spans `size` entries."""
    return tuple(Slice(f"{what} {h}", axis, h * size, (h + 1) * size) for h in range(heads))


def conv_channel_slices(
    qkv_split: tuple[int, int, int], head_k: int, head_v: int, axis: int = -1
) -> list[Slice]:
    """The GDN conv layout ``[q | k | v]``: one slice per band, each with its heads as children."""
    nq, nk, nv = qkv_split
    a = axis
    return [
        Slice("query channel band", a, 0, nq, _offset(head_slices(a, nq // head_k, head_k, "query head"), 0)),
        Slice(
            "key channel band", a, nq, nq + nk, _offset(head_slices(a, nk // head_k, head_k, "key head"), nq)
        ),
        Slice(
            "value channel band",
            a,
            nq + nk,
            nq + nk + nv,
            _offset(head_slices(a, nv // head_v, head_v, "value head"), nq + nk),
        ),
    ]


def _offset(slices: tuple[Slice, ...], by: int) -> tuple[Slice, ...]:
    return tuple(Slice(s.label, s.axis, s.start + by, s.stop + by, s.children) for s in slices)


def per_index_slices(axis: int, count: int, what: str) -> list[Slice]:
    """One slice per index along `axis` (e.g. each value head of a ``[B, T, HV, V]`` output)."""
    return [Slice(f"{what} {i}", axis, i, i + 1, show_range=False) for i in range(count)]
