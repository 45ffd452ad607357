"""Chunked gated delta rule (prefill): the WY / UT-transform form, three Triton launches.

Within a chunk of ``BT = 64`` tokens (per value head, positions t = 0..L-1 after the chunk start,
``G_t`` the in-chunk cumulative sum of the log-decay g, computed in float32) the recurrence in
`clef_runtime.opset` unrolls to

    S_t = e^{G_t} S_0 + Σ_{j≤t} e^{G_t-G_j} k_j u_jᵀ
    (I + A) U = diag(β) V - diag(β e^{G}) K S_0,   A_tj = β_t e^{G_t-G_j} (k_t·k_j)  (j < t)

so with ``T = (I + A)⁻¹`` (unit lower triangular):

    w = T diag(β e^{G}) K,  u = T diag(β) V   (independent of the state: fully parallel)
    v_new = u - w S_0                          (the true per-token update U)
    o_t   = scale (e^{G_t} q_t·S_0 + Σ_{j≤t} e^{G_t-G_j} (q_t·k_j) v_new_j)
    S_L   = e^{G_L} S_0 + Σ_j e^{G_L-G_j} k_j v_new_jᵀ

Every exponent above is a difference G_t - G_j with j ≤ t, or G relative to the chunk start or
end, so it is ≤ 0 whenever g ≤ 0: nothing is exponentiated that can overflow.  Masked entries
(j > t) are zeroed *before* exp.

Launches (grouped value heads read key head ``hv // (HV / H)`` by index: q/k are never
repeated in memory):

1. `delta_rule_prepare._chunk_prepare_kernel` (with the input checks), grid ``(chunk slots · HV)``
   with value heads fastest: per chunk and
   value head, the in-chunk work that does not need the state: cumsum of g; the Gram matrices q
   kᵀ and k kᵀ of the raw inputs with K streamed in slices, the fused L2 norm applied as a
   rank-one rescaling; ``T`` by blockwise forward substitution (the four diagonal 16×16 blocks
   by doubling the block size on tensor cores, row by row on the FMA path, then the block-lower
   part in a few 64×64 dots); then ``w`` and ``u`` (stored in the input dtype), the decayed,
   scaled causal ``q kᵀ`` block ``Aqk``, the cumulative decays ``gc``, and two per-token float32
   factors that the later launches apply to raw k and q rows: ``kf = e^{G_L-G_t}/|k_t|`` (the
   decay to the chunk end) and ``qf = scale e^{G_t}/|q_t|``.  ``gc`` is head-major
   ``[B, HV, T]``; ``kf`` and ``qf`` go by chunk slot, ``[B, HV, NS, BT]`` with ``NS`` slots a
   batch row, so a chunk's 64 values are contiguous and start 256-byte aligned even where a packed
   sequence's chunks do not start at a multiple of 64 tokens.  Tiles of every launch:
   `delta_rule_config.launch_config`.
2. `_chunk_recurrence_kernel`, grid ``(N·HV, V / BV)``: per sequence, value head and V block,
   sequential over the sequence's chunks with the float32 state in registers; each step forms
   ``v_new = u - w S`` and advances the state, ``S ← e^{G_L} S + kᵀ (kf ⊙ v_new)`` (the factor
   scales the rows of v_new, [64, BV], rather than k's, [64, K]: the raw k goes from memory
   straight into the dot and nothing on this sequential chain reduces a row or exponentiates),
   and stores the chunk-start state and ``v_new`` (as the state dots see them) for launch 3.
3. `_chunk_output_kernel`, grid ``(chunk slots · HV, V / BVO)``: the output of every chunk in
   parallel, ``o = qf ⊙ (q S_c) + Aqk v_new`` (raw q into the dot, the factor on the product).

bf16 on tensor cores with at least 128 (sequence, value head) chains, or with sequences of
512 tokens or more on average (`delta_rule_chunk_split.takes_default_path`), is handed to
`clef_runtime.ops.delta_rule_chunk_split` instead (launch 1 storing T in place of w and u, then
the output fused into one walk per chain and V block that forms v_new from T, sequences of 1024
tokens and more cut into segments that start from a warm-up walk; no chunk states stored: faster
there, measured slower for B1 prompts of 256 tokens; docs/performance.md).

Launch 3 costs storing the chunk states (``[chunks, HV, K, V]``) but keeps the output's dots off
the sequential chain; docs/performance.md has the measurements behind this split and behind the
tiles of `delta_rule_config`.

Precision (the policy is in `delta_rule_common`): the Gram matrices take input-dtype operands
with float32 accumulation; ``T`` is solved in float32 (the diagonal blocks at 3xTF32 for f16 and
TF32 for bf16, `doubling_precision`; the block-lower part at TF32 for 16-bit inputs; IEEE on the
FMA path) and rounded to the input dtype for the WY products; ``w``, ``u`` and ``Aqk`` are stored
in the input dtype.  In launch 2 the state stays float32 in registers and
enters its dots as bf16 (bf16 inputs), float32 at TF32 precision (f16: no overflow; IEEE on
the FMA path) or IEEE float32 (f32), as do ``v_new`` and ``kf ⊙ v_new``; k and q enter their dots unscaled (exact in
that dtype) and the factors kf, qf stay float32; the chunk states and ``v_new`` are stored in
that operand dtype (so bf16 inputs store bf16 states, f16 and f32 store float32), and launch 3
computes with exactly the operands launch 2 saw.  The output is rounded once, to v's dtype.  The
fault ``fp16_state_overflow`` (a compile-time flag) rounds the state to the input dtype when it
is loaded and after every chunk.

Variable-length batches: chunks never cross a sequence boundary.  Launch 1 runs over
``ceil(T/64) + N`` slots (an upper bound on the chunk count) and finds each slot's sequence and
chunk by a binary search over ``cu_seqlens`` inside the kernel (so does launch 3; launch 2 stores
chunk c of sequence n in slot ``cu[n] // 64 + n + c``, the slot launch 3 finds); launch 2 reads
its sequence's bounds directly.  Nothing is prepared on the host from the offsets' values, so
there is no sync.  The host side's own work (checks, tiles, allocations, Triton's launcher) is
recorded per input layout and replayed (`clef_runtime.ops.delta_rule_plan`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreted
from clef_runtime.ops import delta_rule_chunk_split, fast_launch
from clef_runtime.ops._common import cdiv
from clef_runtime.ops.delta_rule_common import (
    dot_policy,
    rne_bf16,
    tensor_core_dots,
)
from clef_runtime.ops.delta_rule_plan import MAX_PLANS, Plan, Recorder, plain_launch, tensor_key
from clef_runtime.ops.delta_rule_prepare import (
    _TORCH_DTYPE,
    BT,
    _chunk_prepare_kernel,
    _slot_bounds,
    checked_inputs,
    prepare,
)

# ---------------------------------------------------------------------------------------------
# launch 2: the inter-chunk recurrence
# ---------------------------------------------------------------------------------------------


@triton.jit
def _chunk_step(
    S,
    t0,
    eos,
    k_p,
    w_p,
    u_p,
    gc_p,
    kf_p,
    hs_p,
    vn_p,
    Vb,
    skt,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    STATE_IN_IO_DTYPE: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """One chunk starting at token t0, from the chunk-start state S: store S (as the dots see it,
    at `hs_p`) and v_new (at `vn_p`) for the output launch; return the state at the chunk end."""
    # 64-bit scalar bases, 32-bit per-element offsets (see the prepare kernel)
    k_p += t0 * skt
    w_p += t0 * (HV * K)
    u_p += t0 * (HV * V)
    gc_p += t0
    kf_p += t0
    vn_p += t0 * (HV * V)
    n_live = eos - t0
    r = tl.arange(0, BT)
    live = r < n_live
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    kmask = live[:, None] & (rk < K)[None, :]
    vmask = live[:, None] & (rv < Vb)[None, :]
    gl = tl.load(gc_p + tl.minimum(n_live, BT) - 1)  # decay to the chunk end
    # launch 1's per-token factor for k: its L2 norm and e^{G_L - G_t}.  It scales the rows of
    # v_new in the state update instead of k's (k̃ᵀ v = kᵀ (f ⊙ v)): a [BT, BV] product instead
    # of [BT, K], and the raw k goes from memory straight into the dot; no row reduction and no
    # exp on this sequential chain.
    kfac = tl.load(kf_p + r, mask=live, other=0.0)
    # k, w and u hold values of the input dtype: widening them to STATE_DT is exact
    kc = tl.load(k_p + r[:, None] * skt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
    wc = tl.load(w_p + r[:, None] * (HV * K) + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
    uc = tl.load(u_p + r[:, None] * (HV * V) + rv[None, :], mask=vmask, other=0.0).to(tl.float32)

    Sd = S.to(STATE_DT)
    if ROUND_BF16:
        Sd = rne_bf16(Sd)
    v_new = uc - tl.dot(wc, Sd, input_precision=STATE_PRECISION)
    vd = v_new.to(STATE_DT)
    vk = (v_new * kfac[:, None]).to(STATE_DT)
    if ROUND_BF16:
        vd = rne_bf16(vd)
        vk = rne_bf16(vk)
    s_mask = (rk < K)[:, None] & (rv < Vb)[None, :]
    tl.store(hs_p + rk[:, None] * V + rv[None, :], Sd.to(hs_p.dtype.element_ty), mask=s_mask)
    tl.store(vn_p + r[:, None] * (HV * V) + rv[None, :], vd.to(vn_p.dtype.element_ty), mask=vmask)

    S = S * tl.exp(gl) + tl.dot(tl.trans(kc), vk, input_precision=STATE_PRECISION)
    if STATE_IN_IO_DTYPE:  # fault fp16_state_overflow: the state held in the input dtype
        S = S.to(k_p.dtype.element_ty).to(tl.float32)
    return S


# T is never specialised: Triton compiles T == 1 as a constant, which makes the chunk loop's trip
# count a constant 1, and that pipelined loop (3 stages) faulted on the H200 (illegal address) for
# a bf16 prompt of one token (bench/repro_short_prompts.py).
@triton.jit(do_not_specialize=["T", "NT", "NS"])
def _chunk_recurrence_kernel(
    k,
    w,
    u,
    gc,
    kf,
    hs,
    vn,
    h0,
    ht,
    cu_seqlens,
    T,
    NT,
    NS,
    skb,
    skt,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    STATE_IN_IO_DTYPE: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    i_nh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    n = i_nh // HV
    hv = i_nh % HV
    h = hv // (HV // H)
    if IS_VARLEN:
        # clamped: offsets are not checked on a GPU (that would sync), so bad ones must give
        # wrong numbers, never an access outside the tensors
        b = n * 0
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + n).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + n + 1).to(tl.int64), bos), T)
        slot0 = bos // BT + n  # the slot of the sequence's first chunk (see `_slot_bounds`)
    else:
        b = n
        bos = n * 0
        eos = n * 0 + T
        slot0 = n * NT

    k_p = k + b * skb + h * K
    tok = b * T * HV + hv
    gc_p = gc + (b * HV + hv) * T  # this head's row of the head-major cumulative decays
    # kf by chunk slot ([B, HV, NS, BT]), offset so that token t0's chunk is at kf_p + t0
    kf_p = kf + ((b * HV + hv) * NS + slot0 - b * NS) * BT - bos
    w_p = w + tok * K
    u_p = u + tok * V + i_v * BV
    vn_p = vn + tok * V + i_v * BV
    hs_p = hs + (slot0 * HV + hv) * (K * V) + i_v * BV  # chunk c's state is c·HV·K·V further
    Vb = V - i_v * BV  # columns of this V block that exist

    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    h0 += i_nh * K * V + i_v * BV
    ht += i_nh * K * V + i_v * BV
    s_off = rk[:, None] * V + rv[None, :]
    s_mask = (rk < K)[:, None] & (rv < Vb)[None, :]
    S = tl.load(h0 + s_off, mask=s_mask, other=0.0) if HAS_H0 else tl.zeros([BK, BV], dtype=tl.float32)
    if STATE_IN_IO_DTYPE:  # fault fp16_state_overflow: the state held in the input dtype
        S = S.to(k.dtype.element_ty).to(tl.float32)

    if INTERPRETED:
        # Triton 3.6's interpreter cannot take a runtime `range` bound with numpy ≥ 2 (it calls
        # int() on a 1-element array); a while loop sidesteps it
        t0 = bos
        while t0 < eos:
            S = _chunk_step(
                S, t0, eos, k_p, w_p, u_p, gc_p, kf_p, hs_p, vn_p, Vb, skt,
                HV, K, V, BK, BV, BT, STATE_IN_IO_DTYPE, STATE_DT, STATE_PRECISION, ROUND_BF16,
            )  # fmt: skip
            t0 += BT
            hs_p += HV * K * V
    else:
        # a for loop, so the compiler can pipeline the next chunk's loads behind this one's dots
        for c in range(0, tl.cdiv(eos - bos, BT)):
            S = _chunk_step(
                S, bos + c * BT, eos, k_p, w_p, u_p, gc_p, kf_p, hs_p + tl.cast(c, tl.int64) * (HV * K * V),
                vn_p, Vb, skt,
                HV, K, V, BK, BV, BT, STATE_IN_IO_DTYPE, STATE_DT, STATE_PRECISION, ROUND_BF16,
            )  # fmt: skip

    if STORE_FINAL:
        tl.store(ht + s_off, S, mask=s_mask)


# ---------------------------------------------------------------------------------------------
# launch 3: the output, fully parallel over chunks
# ---------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["T", "NT", "N"])
def _chunk_output_kernel(
    q,
    aqk,
    qf,
    hs,
    vn,
    o,
    cu_seqlens,
    T,
    NT,
    N,
    sqb,
    sqt,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """o = qf ⊙ (q S_c) + Aqk v_new (= scale e^{G} q̂ S_c + Aqk v_new) for one chunk slot, value
    head and V block, from the chunk-start state S_c and v_new that launch 2 stored (the operands
    its state dots saw, rounded the same way)."""
    pid = tl.program_id(0).to(tl.int64)  # value heads fastest, as in launch 1
    i_t = pid // HV
    hv = (pid % HV).to(tl.int32)
    i_v = tl.program_id(1)
    h = hv // (HV // H)
    b, t0, eos = _slot_bounds(i_t, cu_seqlens, T, NT, N, BT, IS_VARLEN)
    q += b * sqb + t0 * sqt + h * K
    tok0 = (b * T + t0) * HV + hv
    NS = NT + N if IS_VARLEN else NT  # qf by chunk slot, [B, HV, NS, BT]
    qf += ((b * HV + hv) * NS + i_t - b * NS) * BT
    aqk += tok0 * BT
    vn += tok0 * V + i_v * BV
    o += tok0 * V + i_v * BV
    hs += (i_t * HV + hv) * (K * V) + i_v * BV
    Vb = V - i_v * BV

    r = tl.arange(0, BT)
    live = r < eos - t0
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    kmask = live[:, None] & (rk < K)[None, :]
    vmask = live[:, None] & (rv < Vb)[None, :]
    # the raw q rows go straight into the dot; launch 1's per-token factor (the scale, q's L2
    # norm, e^{G_t}) scales the product's rows
    qfac = tl.load(qf + r, mask=live, other=0.0)
    qc = tl.load(q + r[:, None] * sqt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
    # an empty slot (t0 ≥ eos) has no stored state: every row is masked, so load nothing
    s_mask = (rk < K)[:, None] & (rv < Vb)[None, :] & (t0 < eos)
    Sd = tl.load(hs + rk[:, None] * V + rv[None, :], mask=s_mask, other=0.0).to(STATE_DT)
    a_mask = live[:, None] & (r[None, :] <= r[:, None])  # only the causal blocks were written
    Ac = tl.load(aqk + r[:, None] * (HV * BT) + r[None, :], mask=a_mask, other=0.0).to(STATE_DT)
    vd = tl.load(vn + r[:, None] * (HV * V) + rv[None, :], mask=vmask, other=0.0).to(STATE_DT)
    oc = qfac[:, None] * tl.dot(qc, Sd, input_precision=STATE_PRECISION) + tl.dot(
        Ac, vd, input_precision=STATE_PRECISION
    )
    if ROUND_BF16:
        oc = rne_bf16(oc)
    tl.store(o + r[:, None] * (HV * V) + rv[None, :], oc.to(o.dtype.element_ty), mask=vmask)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    fault_state_in_io_dtype: bool = False,
    tensor_cores: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prefill (see `clef_runtime.opset.OpSet.chunk_gated_delta_rule`).  Returns ``(o [B, T, HV,
    V] in v's dtype, final_state [N, HV, K, V] float32 or None)``.  ``fault_state_in_io_dtype`` is
    the fault ``fp16_state_overflow``, set only by `clef_runtime.ops.faulty`; ``tensor_cores``
    forces the launch configuration (None: the device decides, see `tensor_core_dots`), set by
    `clef_runtime.opset.get_opset` from `clef_runtime.kernel_config`."""
    inputs = (q, k, v, g, beta, cu_seqlens, initial_state)
    planned = None
    if fast_launch.supported(_chunk_prepare_kernel):
        planned = plan_key(
            inputs,
            scale,
            output_final_state,
            use_qk_l2norm,
            fault_state_in_io_dtype,
            tensor_cores,
        )
        if planned is not None:
            key, stream, ptrs = planned
            last = _LAST
            if last and key == last[0]:  # the layout of the call before (the next layer's call)
                return last[1](stream, inputs, ptrs)
            try:
                plan = _PLANS.get(key)
            except TypeError:  # a flag of an unhashable type: no plan for this call
                planned, plan = None, None
            if plan is not None:  # this layout's checks passed and its launches were recorded
                _LAST[:] = (key, plan)
                return plan(stream, inputs, ptrs)
    B, T, H, HV, K, V, N, scale = checked_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    tc = tensor_core_dots(q.dtype, q.device, tensor_cores)
    rec = Recorder(inputs) if planned is not None and _seen_before(planned[0]) else None

    if not fault_state_in_io_dtype and delta_rule_chunk_split.takes_default_path(
        q.dtype, tc, N, HV, K, V, B * T
    ):
        # enough (sequence, value head) chains to fill the GPU unsplit, or long sequences split
        # into segments with warm-ups: the output fused into the walk, no chunk states stored
        # (`delta_rule_chunk_split`; measured faster there); the inputs are checked already
        out = delta_rule_chunk_split.run_split(
            q, k, v, g, beta, (T, H, HV, K, V, N), scale, initial_state, output_final_state, cu_seqlens,
            use_qk_l2norm, rec=rec,
        )  # fmt: skip
        _keep(planned, rec)
        return out
    # the chunk-start states and v_new, as the state dots see them (STATE_DT), for launch 3; for
    # bf16 on a GPU v_new has u's dtype and overwrites it (each element of u is read once, by the
    # program that writes the same element of v_new)
    policy = dot_policy(q.dtype, _chunk_prepare_kernel, tc)
    state_torch = _TORCH_DTYPE[policy.state_dtype]
    slots = B * cdiv(T, BT) if cu_seqlens is None else cdiv(T, BT) + N
    own_vn = state_torch != q.dtype
    extra = (((slots, HV, K, V), state_torch), ((B, T, HV, V), state_torch) if own_vn else None)
    p = prepare(
        q, k, v, g, beta, N, scale, cu_seqlens, use_qk_l2norm, output_final_state, tc, extra=extra, rec=rec
    )
    cfg = p.cfg
    hs = p.extra[0]
    vn = p.extra[1] if own_vn else p.u
    assert hs is not None and vn is not None
    plain_launch(
        rec, _chunk_recurrence_kernel, (N * HV, cdiv(V, cfg.BV)),
        (
            k, p.w, p.u, p.gc, p.kf, hs, vn,
            initial_state if initial_state is not None else p.gc,
            p.final if p.final is not None else p.gc,
            p.cu, T, p.NT, p.NS,
            k.stride(0), k.stride(1),
        ),
        dict(
            H=H, HV=HV, K=K, V=V, BK=cfg.BK, BV=cfg.BV, BT=BT,
            IS_VARLEN=cu_seqlens is not None,
            HAS_H0=initial_state is not None, STORE_FINAL=p.final is not None,
            STATE_IN_IO_DTYPE=fault_state_in_io_dtype,
            STATE_DT=policy.state_dtype, STATE_PRECISION=policy.state_precision, ROUND_BF16=policy.round_bf16,
            INTERPRETED=interpreted(_chunk_recurrence_kernel),
            num_warps=cfg.warps2,
            num_stages=cfg.stages2,
        ),
    )  # fmt: skip
    if T > 0:
        plain_launch(
            rec, _chunk_output_kernel, (p.slots * HV, cdiv(V, cfg.BVO)),
            (q, p.aqk, p.qf, hs, vn, p.o, p.cu, T, p.NT, N, q.stride(0), q.stride(1)),
            dict(
                H=H, HV=HV, K=K, V=V, BK=cfg.BK, BV=cfg.BVO, BT=BT,
                IS_VARLEN=cu_seqlens is not None,
                STATE_DT=policy.state_dtype, STATE_PRECISION=policy.state_precision,
                ROUND_BF16=policy.round_bf16,
                num_warps=cfg.warps3,
            ),
        )  # fmt: skip
    _keep(planned, rec)
    return p.o, p.final


# ---------------------------------------------------------------------------------------------
# plans: a layout's host work done once (`delta_rule_plan`)
# ---------------------------------------------------------------------------------------------

_PLANS: dict[tuple[object, ...], Plan] = {}
# (key, plan) of the last call that took a plan: a model's layers call one layout in turn, and
# comparing a key with the last one skips hashing it (~45 parts), which costs as much again
_LAST: list[Any] = []
# layouts called once: a layout's second call records its plan, so that a caller whose layouts
# rarely repeat (an engine's chunked prefill with a new token count every step) pays the key,
# not the recording (Triton's plain launch and a generated function a launch), on every call
_SEEN: dict[tuple[object, ...], None] = {}


def _seen_before(key: tuple[object, ...]) -> bool:
    """Whether a call of this layout came before (and note this one)."""
    if key in _SEEN:
        return True
    if len(_SEEN) >= MAX_PLANS:
        _SEEN.clear()
    _SEEN[key] = None
    return False


def plan_key(
    inputs: tuple[torch.Tensor | None, ...],
    scale: float | None,
    output_final_state: bool,
    use_qk_l2norm: bool,
    fault: bool,
    tensor_cores: bool | None,
) -> tuple[tuple[object, ...], int, list[int]] | None:
    """(the key of a call's plan, the current stream, the inputs' addresses), or None where a call
    takes no plan (not on a CUDA device, or arguments that are not tensors: the plain path then
    checks them).  The key holds what the checks read (shapes, strides, dtypes, devices), each
    address's remainder mod 16 (Triton's specialisation), the flags and the current device (the
    tiles are a function of these: `delta_rule_config`)."""
    if scale is not None and type(scale) not in (float, int):
        return None  # (a tensor's value could change under the same key)
    try:
        q, k, v, g, beta, cu, h0 = inputs
        if not q.is_cuda:  # type: ignore[union-attr]
            return None
        device, stream = fast_launch.current_stream()
        # the addresses in `delta_rule_plan.Recorder.sources` order (o and the final state last)
        ptrs = [
            q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),  # type: ignore[union-attr]
            0 if cu is None else cu.data_ptr(), 0 if h0 is None else h0.data_ptr(), 0, 0,
        ]  # fmt: skip
        key = (
            q.shape, q.stride(), q.dtype, q.get_device(),  # type: ignore[union-attr]
            k.shape, k.stride(), k.dtype, k.get_device(),  # type: ignore[union-attr]
            v.shape, v.stride(), v.dtype, v.get_device(),  # type: ignore[union-attr]
            g.shape, g.stride(), g.dtype, g.get_device(),  # type: ignore[union-attr]
            beta.shape, beta.stride(), beta.dtype, beta.get_device(),  # type: ignore[union-attr]
            tensor_key(cu), tensor_key(h0),
            ptrs[0] & 15, ptrs[1] & 15, ptrs[2] & 15, ptrs[3] & 15, ptrs[4] & 15, ptrs[5] & 15, ptrs[6] & 15,
            scale, bool(output_final_state), bool(use_qk_l2norm), bool(fault), tensor_cores, device,
        )  # fmt: skip
    except (AttributeError, TypeError, ValueError):
        return None
    # every part is hashable (shapes, strides, dtypes, ints, floats, flags, tuples of settings):
    # the dict lookup that follows is the only hash (a tuple's hash is not cached)
    return key, stream, ptrs


def _keep(planned: tuple[tuple[object, ...], int, list[int]] | None, rec: Recorder | None) -> None:
    """Store the plan `rec` recorded under the call's key."""
    if planned is None or rec is None:
        return
    plan = rec.plan()
    if plan is None:
        return
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
        _LAST.clear()
    _PLANS[planned[0]] = plan
