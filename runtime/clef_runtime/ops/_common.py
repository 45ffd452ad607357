"""Helpers shared by clef's Triton kernels: input checks with one error style, launch helpers and a
few `@triton.jit` math functions.

This module is imported by every op family (the delta-rule kernels included): keep its names and
signatures stable, add rather than change.

Error messages name the op, the argument and what was expected, so a caller can fix the call
without reading the kernel: ``causal_conv1d: weight has 8 channels but x has 12 (...)``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from clef_runtime.dtypes import dtype_name, torch_dtypes
from clef_runtime.interpreter import interpreting

FLOAT_DTYPES: tuple[torch.dtype, ...] = tuple(torch_dtypes().values())


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are
# constexpr functions whose wrapper costs ~13 µs a call on the host (2-core build machine), and
# an op computes several of these per call (docs/performance.md, "fourteenth pass").


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    """The device's SM count (1 off a CUDA device: the interpreter runs one program at a time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (1 for n ≤ 1), as triton.next_power_of_2."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def shape_str(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = FLOAT_DTYPES,
    device: torch.device | None = None,
    contiguous: bool = True,
    layout: str = "",
) -> torch.Tensor:
    """Check one tensor argument; returns it typed as a tensor.  ``layout`` (e.g. ``"[B, T, D]"``)
    is quoted in the messages so the caller sees what shape was meant."""
    hint = f" (expected {layout})" if layout else ""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dims{hint}, got shape {shape_str(t)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{op}: {name} has dtype {dtype_name(t.dtype)}; supported: {allowed}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but the inputs are on {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(
            f"{op}: {name} {shape_str(t)} is not contiguous (strides {tuple(t.stride())}); "
            f"pass {name}.contiguous()"
        )
    return t


def check_runnable(op: str, device: torch.device) -> None:
    """Triton compiles for GPUs only; on the CPU it can only interpret."""
    if device.type == "cpu" and not interpreting():
        raise RuntimeError(
            f"{op}: the inputs are on the CPU; clef's Triton kernels need a CUDA device, "
            "or set TRITON_INTERPRET=1 before importing triton to run them in the (slow) interpreter"
        )


def check_cu_seqlens(op: str, cu_seqlens: torch.Tensor, B: int, T: int, device: torch.device) -> int:
    """Validate packed-sequence offsets and return N, the number of sequences.

    Zero-length sequences are legal (their final state is their initial state).  The values are
    checked only when that costs no device sync (a CPU tensor); on a GPU the kernels clamp every
    index they derive from ``cu_seqlens``, so bad offsets give wrong numbers, never a wild access.
    """
    check_tensor(op, "cu_seqlens", cu_seqlens, ndim=1, dtypes=(torch.int32,), device=device, layout="[N + 1]")
    if B != 1:
        raise ValueError(
            f"{op}: cu_seqlens packs sequences into a batch of 1, but the batch is {B}; "
            f"concatenate the sequences along time into [1, T, ...]"
        )
    if cu_seqlens.numel() < 2:
        raise ValueError(
            f"{op}: cu_seqlens needs at least 2 entries ([0, T] for one sequence), got {cu_seqlens.numel()}"
        )
    if cu_seqlens.device.type == "cpu":
        cu = cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != T or any(b < a for a, b in itertools.pairwise(cu)):
            raise ValueError(f"{op}: cu_seqlens {cu} must start at 0, be non-decreasing and end at T={T}")
    return int(cu_seqlens.numel()) - 1


def check_state_indices(
    op: str, state_indices: torch.Tensor, B: int, pool: int, device: torch.device
) -> None:
    """``state_indices`` int32 ``[B]``: a slot of the state pool per batch row, negative for padding.
    Slots are range-checked only on a CPU tensor (no device sync); kernels treat an out-of-range
    slot like padding rather than touch memory outside the pool."""
    check_tensor(
        op, "state_indices", state_indices, ndim=1, dtypes=(torch.int32,), device=device, layout="[B]"
    )
    if state_indices.shape[0] != B:
        raise ValueError(f"{op}: state_indices has {state_indices.shape[0]} entries but the batch is {B}")
    if state_indices.device.type == "cpu" and state_indices.numel() and int(state_indices.max()) >= pool:
        raise ValueError(
            f"{op}: state_indices refers to slot {int(state_indices.max())} but the state pool has {pool} slots"
        )


def row_tile(M: int, N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a row-wise op over ``[M, N]`` that keeps whole rows in one
    tile: about 4K elements per program on a GPU (enough bytes in flight per SM at 4 warps), larger
    tiles under the interpreter, where every program costs Python overhead."""
    block_n = next_pow2(N)
    target = 16384 if interpreting() else 4096
    block_m = max(1, min(next_pow2(M), target // block_n))
    tile = block_m * block_n
    num_warps = 8 if tile >= 8192 else (4 if tile >= 2048 else (2 if tile >= 512 else 1))
    return block_m, block_n, num_warps


# Longest row that the row-wise kernels (norms) hold in one tile.
MAX_ROW = 16384


# --- device math (float32 in, float32 out) -----------------------------------------------------


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def log1p_unit(u):
    """log(1 + u) for u in [0, 1], accurate in relative terms also for tiny u.  The hardware log is
    an approximation with an *absolute* error of ~1e-7, which near 1 would swamp small results;
    below 0.125 a short alternating series (truncation < u^10/10, under 1e-9 relative) replaces it."""
    series = u * (
        1.0
        + u
        * (
            -0.5
            + u
            * (
                1.0 / 3.0
                + u
                * (-0.25 + u * (0.2 + u * (-1.0 / 6.0 + u * (1.0 / 7.0 + u * (-0.125 + u * (1.0 / 9.0))))))
            )
        )
    )
    return tl.where(u < 0.125, series, tl.log(1.0 + u))


@triton.jit
def softplus(x):
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)); exact limits at both ends."""
    return tl.maximum(x, 0.0) + log1p_unit(tl.exp(-tl.abs(x)))
