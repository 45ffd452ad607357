"""Shared helpers for the references.

The references are deliberately plain: loops over sequences and tokens, float64 arithmetic, no
fused tricks.  They are slow and obviously right, which is what a comparison needs.
"""

from __future__ import annotations

import itertools

import torch

# Every reference computes in float64: the kernels' own float32 rounding then dominates any error
# we measure, so the tolerances describe the kernels, not the reference.
REF_DTYPE = torch.float64


def seq_bounds(B: int, T: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of each sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    if B != 1:
        raise ValueError(f"cu_seqlens needs a batch of 1 packed sequences, got batch {B}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != T or any(b < a for a, b in itertools.pairwise(cu)):
        raise ValueError(f"cu_seqlens {cu} must start at 0, be non-decreasing and end at T={T}")
    return [(0, a, b) for a, b in itertools.pairwise(cu)]
