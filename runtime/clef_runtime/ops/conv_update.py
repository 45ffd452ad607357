"""Depthwise causal conv1d, decode (`causal_conv1d_update`): one to a few new tokens a row.

It reads ``conv_state`` by slot, computes the new tokens' outputs and shifts the state in place.
Each thread owns four consecutive channels of one row (fewer where ``D`` is not a multiple of
four), so its part of the slot is one contiguous run that it loads and stores as vectors (8 bytes
in bf16); taps and the shifted state are picks among its own registers, and since a thread stores
only state it loaded itself, the in-place shift cannot race.  Prefill is `clef_runtime.ops.conv`,
whose input checks this op shares.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreting
from clef_runtime.ops._common import (
    cdiv,
    check_runnable,
    check_state_indices,
    check_tensor,
    next_pow2,
    shape_str,
    silu,
)
from clef_runtime.ops.conv import check_weight_bias, check_x, silu_flag

# --- kernels ------------------------------------------------------------------------------------


@triton.jit
def _pick(t, i: tl.constexpr):
    """Element ``i`` of each thread's run in a ``[threads, vectors, lanes]`` tile (run index
    ``vector * lanes + lane``, all of it in the thread's registers) as a ``[threads]`` tensor.
    Every index is a compile-time constant per register, so the selects fold and the sum of the
    element with ``-0.0`` (the additive identity) is the element: a register move, no arithmetic."""
    v = tl.arange(0, t.shape[1])[None, :, None]
    j = tl.arange(0, t.shape[2])[None, None, :]
    return tl.sum(tl.sum(tl.where(v * t.shape[2] + j == i, t, -0.0), axis=2), axis=1)


@triton.jit
def _lane(t, i: tl.constexpr):
    """Lane ``i`` of each thread's ``[threads, lanes]`` tile as a ``[threads]`` tensor (folds like
    `_pick`)."""
    return tl.sum(tl.where(tl.arange(0, t.shape[1])[None, :] == i, t, -0.0), axis=1)


@triton.jit
def _bias_tile(bias_ptr, d_thr, c, t_ok, THREADS: tl.constexpr, CPT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The bias of each thread's channels as float32 (zeros without one)."""
    if HAS_BIAS:
        return tl.load(bias_ptr + d_thr[:, None] + c, mask=t_ok[:, None], other=0.0).to(tl.float32)
    else:
        return tl.zeros([THREADS, CPT], dtype=tl.float32)


@triton.jit
def _store_y(y_ptrs, acc, live, t_ok, ACT_SILU: tl.constexpr):
    """One output token of each thread's channels: the activation, zeros for a padding row."""
    if ACT_SILU:
        acc = silu(acc)
    acc = tl.where(live, acc, 0.0)
    tl.store(y_ptrs, acc.to(y_ptrs.dtype.element_ty), mask=t_ok[:, None])


@triton.jit
def _conv_update_kernel(
    x_ptr,
    state_ptr,
    w_ptr,
    bias_ptr,
    idx_ptr,
    y_ptr,
    D,
    pool,
    stride_xb,
    stride_xt,
    stride_pool,
    T_NEW: tl.constexpr,
    W: tl.constexpr,
    CPT: tl.constexpr,
    THREADS: tl.constexpr,
    SV: tl.constexpr,
    WV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    ACT_SILU: tl.constexpr,
):
    """One batch row x ``THREADS * CPT`` channels; each thread owns ``CPT`` consecutive channels
    (``D % CPT == 0``), so its part of the slot is one contiguous run of ``CPT * (W - 1)`` state
    elements: loaded and stored as ``W - 1`` vectors of ``CPT`` (8 bytes at 4 channels of 2
    bytes), with x, y, the weights and the bias as vectors too.  The window's taps and the
    shifted state are register picks inside the thread (`_pick`), and every state element a
    thread stores is one it loaded itself, so the in-place update needs no barrier.  The tiles are
    ``[threads, vectors, lanes]``: the compiler orders dimensions of equal contiguity by index, so
    the threads go to the first and each thread's vectors stay in its registers."""
    row = tl.program_id(0)
    pid_d = tl.program_id(1)
    d_thr = pid_d * (THREADS * CPT) + tl.arange(0, THREADS) * CPT  # each thread's first channel
    t_ok = d_thr < D  # all of a thread's channels, or none
    slot = tl.load(idx_ptr + row) if HAS_INDICES else row
    # Padding rows (negative slot) and out-of-pool slots neither read nor write state.
    live = (slot >= 0) & (slot < pool)
    m = t_ok & live
    v = tl.arange(0, SV)[None, :, None]
    j = tl.arange(0, CPT)[None, None, :]
    s_ptr = state_ptr + slot.to(tl.int64) * stride_pool + (d_thr * (W - 1))[:, None, None] + v * CPT + j
    s_ok = m[:, None, None] & (v < W - 1)
    old = tl.load(s_ptr, mask=s_ok, other=0.0)
    wv = tl.arange(0, WV)[None, :, None]
    wts = tl.load(
        w_ptr + (d_thr * W)[:, None, None] + wv * CPT + j, mask=t_ok[:, None, None] & (wv < W), other=0.0
    )
    c = tl.arange(0, CPT)[None, :]
    x_row = x_ptr + row.to(tl.int64) * stride_xb + d_thr[:, None] + c
    y_row = y_ptr + row.to(tl.int64) * T_NEW * D + d_thr[:, None] + c
    for t in tl.static_range(W - 1):
        # Output t < W - 1 takes window positions t .. t + W - 1: state columns, then new tokens.
        if t < T_NEW:
            acc = _bias_tile(bias_ptr, d_thr, c, t_ok, THREADS, CPT, HAS_BIAS)
            for k in tl.static_range(W):
                if t + k >= W - 1:
                    xt = tl.load(x_row + (t + k - (W - 1)) * stride_xt, mask=m[:, None], other=0.0)
                for ch in tl.static_range(CPT):
                    tap = _pick(old, ch * (W - 1) + t + k) if t + k < W - 1 else _lane(xt, ch)
                    prod = tap.to(tl.float32) * _pick(wts, ch * W + k).to(tl.float32)
                    acc += tl.where(c == ch, prod[:, None], -0.0)
            _store_y(y_row + t * D, acc, live, t_ok, ACT_SILU)
    if T_NEW > W - 1:
        # Outputs from W - 1 on read new tokens only: a loop over them with the weights
        # regrouped once as [threads, tap, channel] and the W taps as one tile.
        wk = tl.zeros([THREADS, WV, CPT], dtype=tl.float32)
        for k in tl.static_range(W):
            for ch in tl.static_range(CPT):
                wk = tl.where((wv == k) & (j == ch), _pick(wts, ch * W + k).to(tl.float32)[:, None, None], wk)
        x_taps = x_ptr + row.to(tl.int64) * stride_xb + d_thr[:, None, None] + j + (wv - (W - 1)) * stride_xt
        for t in range(W - 1, T_NEW):
            xw = tl.load(x_taps + t * stride_xt, mask=m[:, None, None] & (wv < W), other=0.0).to(tl.float32)
            acc = _bias_tile(bias_ptr, d_thr, c, t_ok, THREADS, CPT, HAS_BIAS) + tl.sum(wk * xw, axis=1)
            _store_y(y_row + t * D, acc, live, t_ok, ACT_SILU)
    # The new state: window positions T_NEW .. T_NEW + W - 2, from the old state while they lie
    # in it, then from the new tokens (each token loaded once).
    new = tl.zeros([THREADS, SV, CPT], dtype=old.dtype)
    for k in tl.static_range(W - 1):
        if k + T_NEW < W - 1:
            for ch in tl.static_range(CPT):
                new = tl.where(
                    v * CPT + j == ch * (W - 1) + k,
                    _pick(old, ch * (W - 1) + k + T_NEW).to(old.dtype)[:, None, None],
                    new,
                )
        else:
            xt = tl.load(x_row + (k + T_NEW - (W - 1)) * stride_xt, mask=m[:, None], other=0.0).to(old.dtype)
            for ch in tl.static_range(CPT):
                new = tl.where(v * CPT + j == ch * (W - 1) + k, _lane(xt, ch)[:, None, None], new)
    tl.store(s_ptr, new, mask=s_ok)


# --- wrapper ------------------------------------------------------------------------------------


class UpdateConfig(NamedTuple):
    """The decode kernel's launch shape: channels per thread, threads per program, and warps."""

    cpt: int
    threads: int
    num_warps: int


def _update_config(D: int) -> UpdateConfig:
    """Four channels per thread where ``D`` allows (8-byte accesses in bf16; else the largest
    power of two dividing ``D``) and four warps per program: 512 channels of one row.  Measured on
    the H200 at B256, D = 8192, bf16 (docs/performance.md, "Conv kernels"): within 3% of a copy
    kernel moving the same bytes, ahead of eight channels a thread on one warp (11.96 µs).  The
    interpreter takes four threads a program, so the CPU tests' 48 channels span several programs."""
    cpt = 4
    while D % cpt:
        cpt //= 2
    if interpreting():
        return UpdateConfig(cpt, 4, 1)
    return UpdateConfig(cpt, 128, 4)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode: see `clef_runtime.opset.OpSet.causal_conv1d_update`.  ``conv_state`` is shifted in
    place; a row whose ``state_indices`` entry is negative gets zeros and leaves the pool alone.
    Live rows must name distinct slots (two rows shifting one slot would race)."""
    op = "causal_conv1d_update"
    check_x(op, x)
    B, T_new, _ = x.shape
    D, W = check_weight_bias(op, x, weight, bias)
    act_silu = silu_flag(op, activation)
    check_tensor(
        op, "conv_state", conv_state, ndim=3, device=x.device, contiguous=False, layout="[pool, D, W - 1]"
    )
    if tuple(conv_state.shape[1:]) != (D, W - 1):
        raise ValueError(
            f"{op}: conv_state is {shape_str(conv_state)} but must be [pool, D, W - 1] = [pool, {D}, {W - 1}]"
        )
    if conv_state.stride(2) != 1 or conv_state.stride(1) != W - 1:
        raise ValueError(
            f"{op}: each slot of conv_state must be contiguous [D, W - 1] (strides {tuple(conv_state.stride())}); "
            "it is updated in place, so pass a tensor whose slots are dense"
        )
    pool = conv_state.shape[0]
    if state_indices is not None:
        check_state_indices(op, state_indices, B, pool, x.device)
    elif pool < B:
        raise ValueError(
            f"{op}: batch {B} needs state_indices or a conv_state pool of at least {B} slots, got {pool}"
        )
    if T_new > 32:
        raise ValueError(
            f"{op}: {T_new} new tokens per row is a prefill; use causal_conv1d with initial_state"
        )
    check_runnable(op, x.device)

    y = torch.empty((B, T_new, D), dtype=x.dtype, device=x.device)
    if B * T_new * D == 0:
        return y
    cfg = _update_config(D)
    _conv_update_kernel[(B, cdiv(D, cfg.threads * cfg.cpt))](
        x,
        conv_state,
        weight,
        bias if bias is not None else x,
        state_indices if state_indices is not None else x,
        y,
        D,
        pool,
        x.stride(0),
        x.stride(1),
        conv_state.stride(0),
        T_NEW=T_new,
        W=W,
        CPT=cfg.cpt,
        THREADS=cfg.threads,
        SV=next_pow2(W - 1),
        WV=next_pow2(W),
        HAS_BIAS=bias is not None,
        HAS_INDICES=state_indices is not None,
        ACT_SILU=act_silu,
        num_warps=cfg.num_warps,
    )
    return y


__all__ = ["causal_conv1d_update"]
