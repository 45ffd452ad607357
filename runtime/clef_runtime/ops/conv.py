"""Depthwise causal conv1d over time, prefill (`causal_conv1d`), and the input checks it shares
with decode (`clef_runtime.ops.conv_update`).

Prefill is memory bound (W multiply-adds per element), so the design goal is one pass over ``x``
and ``y`` in DRAM with few registers per element:

* the bulk kernel: a program owns ``CHUNK_T`` rows x ``BLOCK_D`` channels of one batch row,
  channels contiguous (the layout the projections produce), and streams down its rows eight at
  a time, keeping the last ``W - 1`` input rows in registers: each input row is read from DRAM
  once (plus a ``W - 1``-row halo per chunk), with no shifted re-reads.  The next eight rows are
  loaded before the current eight are stored (the compiler may not move a load of ``x`` above a
  store to ``y``: they could alias), so 16 row loads per thread are in flight.  A tap that lies
  before its sequence start contributes zero, so packed sequences can start anywhere in a chunk;
* with ``cu_seqlens`` a program finds the sequence of its first row by a binary search over the
  offsets in the kernel (no host sync, no per-sequence launch bookkeeping) and searches again
  only when a row reaches the next sequence's start;
* the edge kernel, over ``(N, channel blocks)``: with an initial state it computes the first
  ``W - 1`` outputs of each sequence (the only ones whose taps read the state; the bulk kernel
  leaves those rows to it, so the two write disjoint rows), and it writes the final state (the
  last ``W - 1`` inputs, reaching into the initial state when the sequence is shorter).  Keeping
  the state gathers out of the bulk kernel halves its register use; being per sequence, the edge
  kernel is also right for zero-length sequences, which no tile sees.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreting
from clef_runtime.ops._common import (
    cdiv,
    check_cu_seqlens,
    check_runnable,
    check_tensor,
    next_pow2,
    shape_str,
    silu,
)

MAX_WIDTH = 8


# --- kernels ------------------------------------------------------------------------------------


@triton.jit
def _wcol(w_row, k: tl.constexpr, W: tl.constexpr, d_ok, dflt):
    """The weight multiplying ``x[t - k]`` (column ``W - 1 - k``) as float32, ``dflt`` for k >= W."""
    if k < W:
        return tl.load(w_row + (W - 1 - k), mask=d_ok, other=0.0).to(tl.float32)
    else:
        return dflt


@triton.jit
def _hist(x_row, t0, k: tl.constexpr, W: tl.constexpr, lo, stride_xt, d_ok, dflt):
    """``x[t0 - k]`` as float32 (zero before row ``lo``, the sequence start), ``dflt`` for k >= W."""
    if k < W:
        return tl.load(x_row + (t0 - k).to(tl.int64) * stride_xt, mask=d_ok & (t0 - k >= lo), other=0.0).to(
            tl.float32
        )
    else:
        return dflt


@triton.jit
def _rows8(x_row, tg, lim, stride_xt, d_ok):
    """Rows tg .. tg + 7 as float32 (zero from row ``lim`` on): eight independent loads, issued
    together (the compiler may not hoist a load above a store to ``y``: they could alias)."""
    p = x_row + tg.to(tl.int64) * stride_xt
    x0 = tl.load(p, mask=d_ok & (tg < lim), other=0.0).to(tl.float32)
    x1 = tl.load(p + stride_xt, mask=d_ok & (tg + 1 < lim), other=0.0).to(tl.float32)
    x2 = tl.load(p + 2 * stride_xt, mask=d_ok & (tg + 2 < lim), other=0.0).to(tl.float32)
    x3 = tl.load(p + 3 * stride_xt, mask=d_ok & (tg + 3 < lim), other=0.0).to(tl.float32)
    x4 = tl.load(p + 4 * stride_xt, mask=d_ok & (tg + 4 < lim), other=0.0).to(tl.float32)
    x5 = tl.load(p + 5 * stride_xt, mask=d_ok & (tg + 5 < lim), other=0.0).to(tl.float32)
    x6 = tl.load(p + 6 * stride_xt, mask=d_ok & (tg + 6 < lim), other=0.0).to(tl.float32)
    x7 = tl.load(p + 7 * stride_xt, mask=d_ok & (tg + 7 < lim), other=0.0).to(tl.float32)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _seq_of(cu_ptr, t, N, SEARCH_STEPS: tl.constexpr):
    """The sequence of row ``t``: the last n with cu[n] <= t (ties resolve past zero-length
    sequences).  Invariant lo <= answer <= hi; once lo == hi further steps change nothing, so
    SEARCH_STEPS only has to be large enough, and is bucketed to limit recompiles.  The clamp
    keeps out-of-contract offsets inside [0, N - 1]."""
    lo = t * 0
    hi = lo + N
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi + 1) >> 1
        go = tl.load(cu_ptr + mid) <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return tl.minimum(lo, N - 1)


@triton.jit
def _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS: tl.constexpr):
    """(start, next start) of row ``t``'s sequence, given those of row ``t - 1``: rows only move
    forward, so a new search is needed only when ``t`` reaches the next sequence's first row."""
    if t >= nxt:
        seq = _seq_of(cu_ptr, t, N, SEARCH_STEPS)
        start = tl.load(cu_ptr + seq)
        nxt = tl.load(cu_ptr + seq + 1)
    return start, nxt


@triton.jit
def _conv_row(
    a0, a1, a2, a3, a4, a5, a6, a7, v0, v1, v2, v3, v4, v5, v6, v7,
    rel, bias_v, y_row, t, lim, D, d_ok,
    W: tl.constexpr, MASK_TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, SKIP_HEAD: tl.constexpr,
    ACT_SILU: tl.constexpr,
):  # fmt: skip
    """One output row from its taps ``a_k = x[t - k]`` and weights ``v_k``; ``rel`` is the row's
    position in its sequence (with MASK_TAPS, tap k counts only if rel >= k)."""
    if MASK_TAPS:
        acc = a0 * v0 + tl.where(rel >= 1, a1, 0.0) * v1
        if W > 2:
            acc += tl.where(rel >= 2, a2, 0.0) * v2
        if W > 3:
            acc += tl.where(rel >= 3, a3, 0.0) * v3
        if W > 4:
            acc += tl.where(rel >= 4, a4, 0.0) * v4
        if W > 5:
            acc += tl.where(rel >= 5, a5, 0.0) * v5
        if W > 6:
            acc += tl.where(rel >= 6, a6, 0.0) * v6
        if W > 7:
            acc += tl.where(rel >= 7, a7, 0.0) * v7
    else:
        acc = a0 * v0 + a1 * v1
        if W > 2:
            acc += a2 * v2
        if W > 3:
            acc += a3 * v3
        if W > 4:
            acc += a4 * v4
        if W > 5:
            acc += a5 * v5
        if W > 6:
            acc += a6 * v6
        if W > 7:
            acc += a7 * v7
    if HAS_BIAS:
        acc += bias_v
    if ACT_SILU:
        acc = silu(acc)
    ok = d_ok & (t < lim)
    if SKIP_HEAD:
        ok &= rel >= W - 1  # the edge kernel writes the rows that read the state
    tl.store(y_row + t.to(tl.int64) * D, acc.to(y_row.dtype.element_ty), mask=ok)


@triton.jit
def _conv_fwd_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    cu_ptr,
    y_ptr,
    T,
    D,
    N,
    stride_xb,
    stride_xt,
    W: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    CHUNK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SKIP_HEAD: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    ACT_SILU: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    t0 = pid_t * CHUNK_T
    x_row = x_ptr + b.to(tl.int64) * stride_xb + d
    y_row = y_ptr + b.to(tl.int64) * T * D + d

    # v_k multiplies x[t - k]; taps k >= W alias v0 and are never read.
    v0 = _wcol(w_ptr + d * W, 0, W, d_ok, None)
    v1 = _wcol(w_ptr + d * W, 1, W, d_ok, v0)
    v2 = _wcol(w_ptr + d * W, 2, W, d_ok, v0)
    v3 = _wcol(w_ptr + d * W, 3, W, d_ok, v0)
    v4 = _wcol(w_ptr + d * W, 4, W, d_ok, v0)
    v5 = _wcol(w_ptr + d * W, 5, W, d_ok, v0)
    v6 = _wcol(w_ptr + d * W, 6, W, d_ok, v0)
    v7 = _wcol(w_ptr + d * W, 7, W, d_ok, v0)
    bias_v = tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32) if HAS_BIAS else v0

    if IS_VARLEN:
        seq = _seq_of(cu_ptr, t0, N, SEARCH_STEPS)
        start = tl.load(cu_ptr + seq)
        nxt = tl.load(cu_ptr + seq + 1)  # first row of a later sequence
    else:
        start = 0
        nxt = T
    # History h_k = x[t0 - k], zero before the sequence start; h_k for k >= W is never read.
    h1 = _hist(x_row, t0, 1, W, start, stride_xt, d_ok, None)
    h2 = _hist(x_row, t0, 2, W, start, stride_xt, d_ok, h1)
    h3 = _hist(x_row, t0, 3, W, start, stride_xt, d_ok, h1)
    h4 = _hist(x_row, t0, 4, W, start, stride_xt, d_ok, h1)
    h5 = _hist(x_row, t0, 5, W, start, stride_xt, d_ok, h1)
    h6 = _hist(x_row, t0, 6, W, start, stride_xt, d_ok, h1)
    h7 = _hist(x_row, t0, 7, W, start, stride_xt, d_ok, h1)

    lim = tl.minimum(T, t0 + CHUNK_T)  # this program's rows are [t0, lim)
    # Software pipelining by hand: the next group's eight loads go out before this group's
    # stores (measured: without it each group waits a full DRAM round trip).
    n0, n1, n2, n3, n4, n5, n6, n7 = _rows8(x_row, t0, lim, stride_xt, d_ok)
    for g in range(0, CHUNK_T, 8):
        tg = t0 + g
        x0, x1, x2, x3, x4, x5, x6, x7 = n0, n1, n2, n3, n4, n5, n6, n7
        n0, n1, n2, n3, n4, n5, n6, n7 = _rows8(x_row, tg + 8, lim, stride_xt, d_ok)
        # Row tg + i: taps x[t], x[t - 1], ... and the same weights and flags throughout.
        # fmt: off
        t = tg
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x0, h1, h2, h3, h4, h5, h6, h7, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 1
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x1, x0, h1, h2, h3, h4, h5, h6, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 2
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x2, x1, x0, h1, h2, h3, h4, h5, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 3
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x3, x2, x1, x0, h1, h2, h3, h4, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 4
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x4, x3, x2, x1, x0, h1, h2, h3, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 5
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x5, x4, x3, x2, x1, x0, h1, h2, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 6
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x6, x5, x4, x3, x2, x1, x0, h1, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        t = tg + 7
        if IS_VARLEN:
            start, nxt = _advance(cu_ptr, t, N, start, nxt, SEARCH_STEPS)
        _conv_row(x7, x6, x5, x4, x3, x2, x1, x0, v0, v1, v2, v3, v4, v5, v6, v7,
                  t - start, bias_v, y_row, t, lim, D, d_ok,
                  W, IS_VARLEN, HAS_BIAS, SKIP_HEAD, ACT_SILU)
        # fmt: on
        # The window moves on by eight rows.
        h1 = x7
        if W > 2:
            h2 = x6
        if W > 3:
            h3 = x5
        if W > 4:
            h4 = x4
        if W > 5:
            h5 = x3
        if W > 6:
            h6 = x2
        if W > 7:
            h7 = x1


@triton.jit
def _conv_edges_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    init_ptr,
    cu_ptr,
    y_ptr,
    fin_ptr,
    T,
    D,
    stride_xb,
    stride_xt,
    stride_init_n,
    W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_INIT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    ACT_SILU: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
):
    n = tl.program_id(0)
    pid_d = tl.program_id(1)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    k = tl.arange(0, BLOCK_K)  # 0 .. W - 2: a state column, or one of the first W - 1 rows
    k_ok = k < W - 1
    if IS_VARLEN:
        x_base = x_ptr
        y_base = y_ptr
        start = tl.minimum(tl.maximum(tl.load(cu_ptr + n), 0), T)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + n + 1), start), T)
    else:
        x_base = x_ptr + n.to(tl.int64) * stride_xb
        y_base = y_ptr + n.to(tl.int64) * T * D
        start = 0
        end = T
    init_base = init_ptr + n.to(tl.int64) * stride_init_n

    if HAS_INIT:
        # Rows start + k: tap j reads sequence position k - (W - 1) + j, i.e. state column k + j
        # while that is < W - 1, else input row start + k + j - (W - 1).
        row = start + k
        row_ok = (k_ok & (row < end))[:, None] & d_ok[None, :]
        acc = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
        for j in tl.static_range(W):
            inside = (k + j >= W - 1)[:, None]
            xv = tl.load(
                x_base + (row + (j - (W - 1))).to(tl.int64)[:, None] * stride_xt + d[None, :],
                mask=row_ok & inside,
                other=0.0,
            ).to(tl.float32)
            hv = tl.load(
                init_base + d[None, :] * (W - 1) + (k + j)[:, None], mask=row_ok & ~inside, other=0.0
            ).to(tl.float32)
            acc += (xv + hv) * tl.load(w_ptr + d * W + j, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        if ACT_SILU:
            acc = silu(acc)
        tl.store(
            y_base + row.to(tl.int64)[:, None] * D + d[None, :], acc.to(y_ptr.dtype.element_ty), mask=row_ok
        )

    if WRITE_FINAL:
        # The last W - 1 inputs, oldest first, as a [BLOCK_D, BLOCK_K] tile: the state's layout.
        pos = end - (W - 1) + k
        inside = (pos >= start)[None, :]
        ok = d_ok[:, None] & k_ok[None, :]
        v = tl.load(
            x_base + pos.to(tl.int64)[None, :] * stride_xt + d[:, None], mask=ok & inside, other=0.0
        ).to(tl.float32)
        if HAS_INIT:
            hv = tl.load(
                init_base + d[:, None] * (W - 1) + (pos - start + (W - 1))[None, :],
                mask=ok & ~inside,
                other=0.0,
            ).to(tl.float32)
            v = tl.where(inside, v, hv)
        out = fin_ptr + n.to(tl.int64) * D * (W - 1) + d[:, None] * (W - 1) + k[None, :]
        tl.store(out, v.to(fin_ptr.dtype.element_ty), mask=ok)


# --- wrappers -----------------------------------------------------------------------------------


def silu_flag(op: str, activation: str | None) -> bool:
    if activation is None:
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"{op}: activation {activation!r} is not supported: use 'silu' or None")


def check_weight_bias(
    op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[int, int]:
    D = x.shape[-1]
    check_tensor(op, "weight", weight, device=x.device, contiguous=False)
    if weight.dim() == 3 and weight.shape[1] == 1:
        raise ValueError(
            f"{op}: weight {shape_str(weight)} looks like a Conv1d weight [D, 1, W]; pass weight.squeeze(1)"
        )
    check_tensor(op, "weight", weight, ndim=2, layout="[D, W]")
    Dw, W = weight.shape
    if Dw != D:
        raise ValueError(f"{op}: weight has {Dw} channels but x has {D} (x is [B, T, D], weight [D, W])")
    if not 2 <= W <= MAX_WIDTH:
        raise ValueError(
            f"{op}: conv width W={W} (weight {shape_str(weight)}) is not supported: use 2..{MAX_WIDTH}"
        )
    if bias is not None:
        check_tensor(op, "bias", bias, ndim=1, device=x.device, layout="[D]")
        if bias.shape[0] != D:
            raise ValueError(f"{op}: bias has {bias.shape[0]} channels but x has {D}")
    return D, W


def check_x(op: str, x: torch.Tensor) -> torch.Tensor:
    check_tensor(op, "x", x, ndim=3, contiguous=False, layout="[B, T, D]")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(
            f"{op}: x {shape_str(x)} must have contiguous channels (strides {tuple(x.stride())}); "
            "pass x.contiguous()"
        )
    return x


def _search_steps(N: int) -> int:
    """Binary-search steps that narrow [0, N] to one sequence: ceil(log2(N + 1)) = N.bit_length(),
    rounded up to a multiple of 4 so that batch sizes share a few compiled variants."""
    return max(4, cdiv(N.bit_length(), 4) * 4)


def _prefill_config(T: int, D: int) -> tuple[int, int, int]:
    """(CHUNK_T, BLOCK_D, num_warps), fixed by shape (no autotuning)."""
    if interpreting():
        # Every program costs the interpreter a fixed number of Python-level ops, so few programs;
        # still small enough that the CPU tests' shapes cross chunk and channel-block edges.
        return 32, 64, 1
    # Swept on the H200 at B1 T32768 D8192 bf16 (docs/performance.md): four contiguous channels
    # per thread, 4 warps, 32 rows per program (8 + 8 rows of loads in flight per thread) beat
    # 8 channels per thread (fewer programs resident) and longer chunks (fewer programs).
    num_warps = max(1, min(4, next_pow2(D) // 128))
    block_d = 4 * 32 * num_warps
    chunk_t = min(32, max(8, next_pow2(T)))
    return chunk_t, block_d, num_warps


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prefill: see `clef_runtime.opset.OpSet.causal_conv1d`.  ``x`` needs contiguous channels;
    its batch and time strides are free.  Zero-length packed sequences are allowed."""
    op = "causal_conv1d"
    check_x(op, x)
    B, T, _ = x.shape
    D, W = check_weight_bias(op, x, weight, bias)
    act_silu = silu_flag(op, activation)
    N = B if cu_seqlens is None else check_cu_seqlens(op, cu_seqlens, B, T, x.device)
    if B > 65535:  # the batch is grid axis 2
        raise ValueError(f"{op}: a batch of {B} rows is too large; pack the sequences with cu_seqlens")
    if initial_state is not None:
        check_tensor(op, "initial_state", initial_state, ndim=3, device=x.device, layout="[N, D, W - 1]")
        if tuple(initial_state.shape) != (N, D, W - 1):
            raise ValueError(
                f"{op}: initial_state is {shape_str(initial_state)} but must be [N, D, W - 1] = "
                f"[{N}, {D}, {W - 1}] (N = {'len(cu_seqlens) - 1' if cu_seqlens is not None else 'B'})"
            )
    check_runnable(op, x.device)

    y = torch.empty((B, T, D), dtype=x.dtype, device=x.device)
    final = torch.empty((N, D, W - 1), dtype=x.dtype, device=x.device) if output_final_state else None
    placeholder = x  # stands in for absent optional pointers; constexpr flags keep it unread
    has_bias, has_init, is_varlen = bias is not None, initial_state is not None, cu_seqlens is not None
    common = dict(W=W, HAS_BIAS=has_bias, IS_VARLEN=is_varlen, ACT_SILU=act_silu)

    chunk_t, block_d, num_warps = _prefill_config(T, D)
    if B * T * D > 0:
        _conv_fwd_kernel[(cdiv(T, chunk_t), cdiv(D, block_d), B)](
            x,
            weight,
            bias if has_bias else placeholder,
            cu_seqlens if is_varlen else placeholder,
            y,
            T,
            D,
            N,
            x.stride(0),
            x.stride(1),
            SEARCH_STEPS=_search_steps(N) if is_varlen else 0,  # no recompiles per batch size
            CHUNK_T=chunk_t,
            BLOCK_D=block_d,
            SKIP_HEAD=has_init,
            num_warps=num_warps,
            **common,
        )
    if (has_init or final is not None) and N * D > 0:
        edge_block_d = 64 if interpreting() else min(256, max(32, next_pow2(D)))
        _conv_edges_kernel[(N, cdiv(D, edge_block_d))](
            x,
            weight,
            bias if has_bias else placeholder,
            initial_state if has_init else placeholder,
            cu_seqlens if is_varlen else placeholder,
            y,
            final if final is not None else placeholder,
            T,
            D,
            x.stride(0),
            x.stride(1),
            initial_state.stride(0) if initial_state is not None else 0,
            BLOCK_D=edge_block_d,
            BLOCK_K=next_pow2(W - 1),
            HAS_INIT=has_init,
            WRITE_FINAL=final is not None,
            num_warps=4,
            **common,
        )
    return y, final


__all__ = ["causal_conv1d", "check_weight_bias", "check_x", "silu_flag"]
