"""Fused recurrent gated delta rule (decode): a few tokens per sequence, token by token, state
updated in place.

One program per (batch row, value head, V block), grid ``(B·HV, V / BV)``.  The program loads
its ``[K, BV]`` slice of the float32 state once, runs the recurrence of `clef_runtime.opset` for
each of the row's T tokens in registers (q/k L2-normalised in float32 on the way in), and writes
the slice back once: decode is bound by that one read and one write of the state, so nothing
else touches memory per token but q, k, v, g, β and the output row.  All arithmetic is float32
(there are no dots to feed tensor cores at T ≈ 1), so every input dtype gets float32 accuracy.

``state_indices[b] < 0`` marks a padding row: its state is neither read nor written (masked
loads/stores, so a padding row costs no state traffic) and its output is zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from clef_runtime.ops._common import cdiv, check_runnable, check_state_indices
from clef_runtime.ops.delta_rule_common import (
    check_gdn_inputs,
    check_state,
    dot_policy,
    pow2_at_least,
    rne_bf16,
)

OP = "fused_recurrent_gated_delta_rule"
# V block and warps: a [128, 64] float32 state slice per program at 4 warps (32 state elements
# per thread), the fastest of the blocks and warps swept on the H200
# (`git show 36b2886:hack/device/sweep_recurrent_table.py`; docs/performance.md, "Decode V blocks").
BV_MAX = 64
WARPS = 4


@triton.jit
def _recurrent_kernel(
    q,
    k,
    v,
    g,
    beta,
    o,
    state,
    state_indices,
    scale,
    T,
    POOL,
    sqb,
    sqt,
    skb,
    skt,
    svb,
    svt,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    L2NORM: tl.constexpr,
    STATE_IN_IO_DTYPE: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    h = hv // (HV // H)
    slot = tl.load(state_indices + b).to(tl.int64) if HAS_INDICES else b
    # negative: padding; past the pool: an unchecked bad index on a GPU, treated like padding
    # rather than touching memory outside the pool
    live = (slot >= 0) & (slot < POOL)
    slot = tl.where(live, slot, 0)

    rk = tl.arange(0, BK)
    cols = i_v * BV + tl.arange(0, BV)
    k_in = rk < K
    v_in = cols < V
    # 64-bit scalar base, 32-bit per-element offsets (an int64 offset tile costs two registers
    # per element)
    s_ptr = state + (slot * HV + hv) * K * V + (rk[:, None] * V + cols[None, :])
    s_mask = k_in[:, None] & v_in[None, :] & live
    S = tl.load(s_ptr, mask=s_mask, other=0.0)
    if STATE_IN_IO_DTYPE:  # fault fp16_state_overflow: the state held in the input dtype
        S = S.to(q.dtype.element_ty).to(tl.float32)

    q_p = q + b * sqb + h * K
    k_p = k + b * skb + h * K
    v_p = v + b * svb + hv * V
    gb = (b * T) * HV + hv  # [B, T, HV]: g, beta
    g += gb
    beta += gb
    o_p = o + gb * V
    # a while loop: Triton 3.6's interpreter cannot take a runtime `range` bound with numpy ≥ 2,
    # and at T ≈ 1 there is nothing for a pipelined for loop to overlap
    t = 0
    while t < T:
        qt = tl.load(q_p + t * sqt + rk, mask=k_in, other=0.0).to(tl.float32)
        kt = tl.load(k_p + t * skt + rk, mask=k_in, other=0.0).to(tl.float32)
        vt = tl.load(v_p + t * svt + cols, mask=v_in, other=0.0).to(tl.float32)
        gt = tl.load(g + t * HV)
        bt = tl.load(beta + t * HV)
        if L2NORM:
            qt = qt * tl.rsqrt(tl.sum(qt * qt, 0) + 1e-6)
            kt = kt * tl.rsqrt(tl.sum(kt * kt, 0) + 1e-6)
        S = S * tl.exp(gt)
        ut = bt * (vt - tl.sum(S * kt[:, None], 0))
        S = S + kt[:, None] * ut[None, :]
        if STATE_IN_IO_DTYPE:
            S = S.to(q.dtype.element_ty).to(tl.float32)
        ot = tl.sum(S * (qt * scale)[:, None], 0)
        if ROUND_BF16:  # the interpreter's own bf16 cast truncates (see `dot_policy`)
            ot = rne_bf16(ot)
        tl.store(o_p + t * (HV * V) + cols, tl.where(live, ot, 0.0).to(o.dtype.element_ty), mask=v_in)
        t += 1
    tl.store(s_ptr, S, mask=s_mask)


def _check_distinct_slots(idx: torch.Tensor) -> None:
    # two rows updating one slot in place would race; checkable for free on a CPU tensor only
    if idx.device.type == "cpu":
        live = [i for i in idx.tolist() if i >= 0]
        if len(set(live)) != len(live):
            raise ValueError(
                f"{OP}: state_indices {idx.tolist()} name a slot twice; each row needs its own slot"
            )


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    state: torch.Tensor,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    fault_state_in_io_dtype: bool = False,
) -> torch.Tensor:
    """Decode (see `clef_runtime.opset.OpSet.fused_recurrent_gated_delta_rule`): ``state``
    ``[pool, HV, K, V]`` float32 is updated in place; returns ``o [B, T, HV, V]`` in v's dtype.
    ``fault_state_in_io_dtype`` is the fault ``fp16_state_overflow``, set only by
    `clef_runtime.ops.faulty`."""
    B, T, H, HV, K, V = check_gdn_inputs(OP, q, k, v, g, beta)
    check_runnable(OP, q.device)
    check_state(OP, "state", state, None, HV, K, V)
    if state.device != q.device:
        raise ValueError(f"{OP}: state is on {state.device} but q is on {q.device}")
    pool = state.shape[0]
    if state_indices is not None:
        check_state_indices(OP, state_indices, B, pool, q.device)
        _check_distinct_slots(state_indices)
    elif pool < B:
        raise ValueError(
            f"{OP}: state has {pool} slots for B={B} rows; pass state_indices or a [B, ...] state"
        )
    scale = K**-0.5 if scale is None else float(scale)
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=q.device)
    if B == 0 or T == 0:
        return o
    BK = pow2_at_least(K, 1)
    BV = min(BV_MAX, pow2_at_least(V, 1))
    _recurrent_kernel[(B * HV, cdiv(V, BV))](
        q, k, v, g, beta, o, state,
        state_indices if state_indices is not None else state,
        scale, T, pool,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV,
        HAS_INDICES=state_indices is not None, L2NORM=use_qk_l2norm,
        STATE_IN_IO_DTYPE=fault_state_in_io_dtype,
        ROUND_BF16=dot_policy(q.dtype, _recurrent_kernel).round_bf16,
        num_warps=WARPS,
    )  # fmt: skip
    return o
