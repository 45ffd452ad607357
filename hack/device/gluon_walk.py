"""An experiment, not part of the runtime: the split design's folded walk
(`delta_rule_chunk_split._split_step_vk`) written in Gluon for Hopper, with the same algebra,
operands and roundings (its outputs are bit-identical to the Triton walk's on the H200), its wgmma
issued asynchronously (OVERLAP) so that the output's two products run beside the state's chain,
and ablations (ABLATE) that drop its loads or its output store to show where a step's time goes.
Measured in docs/performance.md, "tenth pass"; `probe_fold.py` runs it with GLUON=1.

Triton 3.6 waits for every ``tl.dot`` as soon as it is issued (``warp_group_dot_wait {pendings =
0}``), so one walk step runs its five dots one after another.  Two of them, ``Sᵀ qᵀ`` and
``v_newᵀ Aqkᵀ`` (the output), are not on the state's dependent chain.  Here:

1. ``X = Sᵀ k̂ᵀ`` and ``O = Sᵀ qᵀ`` are issued back to back; the step waits for X only.
2. ``yᵀ = (β v - X β e^{G}/|k|)ᵀ``, ``v_newᵀ = yᵀ Tᵀ`` (waits for it, and for O).
3. The state update ``Sᵀ ← e^{g_L} Sᵀ + (v_new ⊙ kf)ᵀ k`` and then ``O ← qf ⊙ O + v_newᵀ Aqkᵀ``
   are issued; the step waits for the state, and the output's product finishes behind it.

Loads: a two-stage ring of asynchronous copies (cp.async) into shared memory, one chunk ahead.
Dense and varlen batches, segments with warm-ups, bf16 only, BV = 64 at 4 warps.  Gluon kernels do
not run in the interpreter.  On sm_90 it spills 640 bytes per thread (the Triton walk: 128-192).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _load_chunk(
    stage, k_s, q_s, t_s, a_s, t0, eos, k_p, q_p, w_p, aqk_p, skt, sqt,
    HV: gl.constexpr, K: gl.constexpr, BK: gl.constexpr, BT: gl.constexpr,
    ROWS_K: gl.constexpr, ROWS_T: gl.constexpr,
):  # fmt: skip
    """Issue the asynchronous copies of chunk ``t0``'s k, q (BT × BK) and T, Aqk (BT × BT) rows
    into ring slot ``stage`` (rows at or past ``eos`` are zero-filled) and commit them as one group."""
    rk_r = gl.arange(0, BT, layout=gl.SliceLayout(1, ROWS_K))
    rk_c = gl.arange(0, BK, layout=gl.SliceLayout(0, ROWS_K))
    tk = t0 + rk_r
    mk = (tk < eos)[:, None] & (rk_c < K)[None, :]
    async_copy.async_copy_global_to_shared(k_s.index(stage), k_p + tk[:, None] * skt + rk_c[None, :], mask=mk)
    async_copy.async_copy_global_to_shared(q_s.index(stage), q_p + tk[:, None] * sqt + rk_c[None, :], mask=mk)
    rt_r = gl.arange(0, BT, layout=gl.SliceLayout(1, ROWS_T))
    rt_c = gl.arange(0, BT, layout=gl.SliceLayout(0, ROWS_T))
    tt = t0 + rt_r
    mt = (tt < eos)[:, None] & (rt_c < BT)[None, :]
    off = tt[:, None] * (HV * BT) + rt_c[None, :]
    async_copy.async_copy_global_to_shared(t_s.index(stage), w_p + off, mask=mt)
    async_copy.async_copy_global_to_shared(a_s.index(stage), aqk_p + off, mask=mt)
    async_copy.commit_group()


@gluon.jit
def _walk_gluon(
    St, t_lo, t_out, t_hi, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, skt, sqt,
    v_p, svt, b_p,
    HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr,
    BT: gl.constexpr, ACC_S: gl.constexpr, ACC_C: gl.constexpr, ROWS_K: gl.constexpr,
    ROWS_T: gl.constexpr, OUT_L: gl.constexpr, OVERLAP: gl.constexpr, ABLATE: gl.constexpr,
):  # fmt: skip
    """The chunks of tokens [t_lo, t_hi) from the transposed state ``St`` (BV × BK, float32, in
    the state product's accumulator layout ACC_S), outputs from t_out on; returns the state."""
    dot_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_C, k_width=2)  # Sᵀ for X and O
    dot_c: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_C, k_width=2)  # y, v_new
    dot_u: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_S, k_width=2)  # (v_new ⊙ kf)ᵀ
    col_c: gl.constexpr = gl.SliceLayout(0, ACC_C)  # per-token factors along a product's columns
    sh_k: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.bfloat16)
    sh_t: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], gl.bfloat16)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, BK], sh_k)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, BK], sh_k)
    t_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, BT], sh_t)
    a_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, BT], sh_t)

    n = gl.cdiv(t_hi - t_lo, BT)
    _load_chunk(
        0, k_s, q_s, t_s, a_s, t_lo, eos, k_p, q_p, w_p, aqk_p, skt, sqt, HV, K, BK, BT, ROWS_K, ROWS_T
    )
    r = gl.arange(0, BT, layout=col_c)
    ro_v = gl.arange(0, BV, layout=gl.SliceLayout(1, OUT_L))
    ro_t = gl.arange(0, BT, layout=gl.SliceLayout(0, OUT_L))
    zero_c = gl.zeros([BV, BT], gl.float32, ACC_C)
    rv_v = gl.arange(0, BV, layout=gl.SliceLayout(1, OUT_L))  # v's rows load coalesced, as o's store
    rt_v = gl.arange(0, BT, layout=gl.SliceLayout(0, OUT_L))
    for c in range(0, n):
        t0 = t_lo + c * BT
        stage = (c % 2).to(gl.int32)
        # every thread is done with the slot the next chunk's copies overwrite (chunk c - 1's)
        gl.thread_barrier()
        if (ABLATE & 1) == 0:
            _load_chunk(
            1 - stage, k_s, q_s, t_s, a_s, t0 + BT, gl.minimum(eos, t_hi), k_p, q_p, w_p, aqk_p, skt, sqt,
            HV, K, BK, BT, ROWS_K, ROWS_T,
        )  # fmt: skip
        # this chunk's per-token factors and v, straight into registers (they wait with the copies)
        live = (t0 + r) < eos
        n_live = eos - t0
        g_last = gl.load(gc_p + t0 + gl.minimum(n_live, BT) - 1)
        kfac = gl.load(kf_p + t0 + r, mask=live, other=0.0)
        bfac = gl.load(u_p + t0 + r, mask=live, other=0.0)
        bvv = gl.load(b_p + (t0 + r) * HV, mask=live, other=0.0)
        qfac = gl.load(qf_p + t0 + r, mask=live, other=0.0)
        tv = t0 + rt_v
        v_t = gl.load(
            v_p + tv[None, :] * svt + rv_v[:, None],
            mask=(rv_v < ncols)[:, None] & (tv < eos)[None, :],
            other=0.0,
        )
        v_t = gl.convert_layout(v_t, ACC_C)
        if (ABLATE & 1) != 0:
            async_copy.commit_group()
        async_copy.wait_group(1)  # this chunk's group (the next one's may be in flight)
        gl.thread_barrier()
        fence_async_shared()  # the copies' writes before the wgmma's reads (async proxy)
        kc = k_s.index(stage)
        Sd = gl.convert_layout(St.to(gl.bfloat16), dot_s)
        X = warpgroup_mma(Sd, kc.permute((1, 0)), zero_c, use_acc=False, is_async=True)
        if OVERLAP:
            Oq = warpgroup_mma(Sd, q_s.index(stage).permute((1, 0)), zero_c, use_acc=False, is_async=True)
            X = warpgroup_mma_wait(1, deps=(X,))
        else:
            X = warpgroup_mma_wait(0, deps=(X,))
            Oq = warpgroup_mma(Sd, q_s.index(stage).permute((1, 0)), zero_c, use_acc=False, is_async=True)
            Oq = warpgroup_mma_wait(0, deps=(Oq,))
        y = v_t.to(gl.float32) * bvv[None, :] - X * bfac[None, :]
        ya = gl.convert_layout(y.to(gl.bfloat16), dot_c)
        Vn = warpgroup_mma(ya, t_s.index(stage).permute((1, 0)), zero_c, use_acc=False, is_async=True)
        Vn, Oq = warpgroup_mma_wait(0, deps=(Vn, Oq))
        vk = gl.convert_layout((Vn * kfac[None, :]).to(gl.bfloat16), dot_u)
        St = warpgroup_mma(vk, kc, St * gl.exp(g_last), is_async=True)
        vd = gl.convert_layout(Vn.to(gl.bfloat16), dot_c)
        Oq = warpgroup_mma(vd, a_s.index(stage).permute((1, 0)), Oq * qfac[None, :], is_async=True)
        St = warpgroup_mma_wait(1, deps=(St,))
        Oq = warpgroup_mma_wait(0, deps=(Oq,))
        oc = gl.convert_layout(Oq.to(gl.bfloat16), OUT_L)
        to = t0 + ro_t
        if (ABLATE & 2) == 0:
            gl.store(
                o_p + to[None, :] * (HV * V) + ro_v[:, None],
                oc,
                mask=(ro_v < ncols)[:, None] & (to < eos)[None, :] & (t0 >= t_out),
            )
    async_copy.wait_group(0)
    return St


@gluon.jit
def segment_output_kernel_gluon(
    q, k, v, beta, w, u, gc, kf, qf, aqk, o, cw, h0, ht, cu_seqlens, T, P,
    sqb, sqt, skb, skt, svb, svt,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, BT: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr,
    STORE_FINAL: gl.constexpr, WARMUP: gl.constexpr, OVERLAP: gl.constexpr = True, ABLATE: gl.constexpr = 0,
):  # fmt: skip
    """`delta_rule_chunk_split._segment_output_kernel` with FORM_WU (launch 1's T in w, the
    factors β e^{G} / |k| in u), bf16, in Gluon: segment s of one sequence, value head and V
    block; its start state from a warm-up walk, then its chunks with the output."""
    gl.static_assert(gl.num_warps() == 4)
    ACC_S: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16]
    )
    ACC_C: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16]
    )
    ROWS_K: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])  # 16-byte copies along K
    ROWS_T: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    OUT_L: gl.constexpr = gl.BlockedLayout([2, 1], [32, 1], [1, 4], [0, 1])  # o's V columns contiguous
    i_nh = gl.program_id(0).to(gl.int64)
    j = gl.program_id(1)
    s = gl.program_id(2).to(gl.int64)
    n = i_nh // HV
    hv = i_nh % HV
    h = hv // (HV // H)
    if IS_VARLEN:
        b = n * 0
        bos = gl.minimum(gl.maximum(gl.load(cu_seqlens + n).to(gl.int64), 0), T)
        eos = gl.minimum(gl.maximum(gl.load(cu_seqlens + n + 1).to(gl.int64), bos), T)
    else:
        b = n
        bos = n * 0
        eos = n * 0 + T
    c0 = j * BV
    ncols = V - c0
    rv = gl.arange(0, BV, layout=gl.SliceLayout(1, ACC_S))
    rk = gl.arange(0, BK, layout=gl.SliceLayout(0, ACC_S))
    s_off = rv[:, None] + rk[None, :] * V  # the state's block, transposed: [BV, BK]
    s_mask = (rv < ncols)[:, None] & (rk < K)[None, :]
    h0 += i_nh * K * V + c0
    ht += i_nh * K * V + c0
    seg = gl.cdiv(gl.cdiv(eos - bos, BT), P)
    t_lo = gl.minimum(bos + s * seg * BT, eos)
    t_hi = gl.minimum(bos + (s + 1) * seg * BT, eos)
    t_w = bos
    if WARMUP:
        c_w = gl.load(cw + i_nh * P + s).to(gl.int64)
        t_w = gl.where(c_w < 0, bos, bos + c_w * BT)
        from_start = c_w < 0
    else:
        from_start = s == s
    if HAS_H0:
        St = gl.load(h0 + s_off, mask=s_mask & from_start, other=0.0)
    else:
        St = gl.zeros([BV, BK], gl.float32, ACC_S)
    tok = b * T * HV + hv
    hd = (b * HV + hv) * T
    St = _walk_gluon(
        St, t_w, t_lo, t_hi, eos, k + b * skb + h * K, w + tok * BT, u + hd, gc + hd, kf + hd,
        q + b * sqb + h * K, qf + hd, aqk + tok * BT, o + tok * V + c0, ncols, skt, sqt,
        v + b * svb + hv * V + c0, svt, beta + tok,
        HV, K, V, BK, BV, BT, ACC_S, ACC_C, ROWS_K, ROWS_T, OUT_L, OVERLAP, ABLATE,
    )  # fmt: skip
    if STORE_FINAL:
        gl.store(ht + s_off, St, mask=s_mask & (s == P - 1))


def chunk_gated_delta_rule_gluon(
    q, k, v, g, beta, *, cu_seqlens=None, output_final_state=True, use_qk_l2norm=True,
    overlap=True, ablate=0,
):  # fmt: skip
    """`chunk_gated_delta_rule_split` at its defaults (folded, 64-wide V blocks, 4 warps), with this
    walk in place of the Triton one (no initial state)."""
    import triton

    from clef_runtime.ops import delta_rule_chunk_split as ds
    from clef_runtime.ops.delta_rule_chunk import BT, checked_inputs, prepare

    _, T, H, HV, K, V, N, scale = checked_inputs(q, k, v, g, beta, None, None, cu_seqlens)
    P = ds.default_segments(N, HV, V, T)
    p = prepare(q, k, v, g, beta, N, scale, cu_seqlens, use_qk_l2norm, output_final_state, True,
                P > 1 and not use_qk_l2norm, True)  # fmt: skip
    varlen = cu_seqlens is not None
    cw = p.gc
    if P > 1:
        cw = torch.empty(N * HV * P, dtype=torch.int32, device=q.device)
        ds._warmup_plan_kernel[(N * HV, P)](
            p.lb if p.lb is not None else p.gc, p.gc, beta, cw, p.cu, ds.WARMUP_LOG_BOUND, T, p.NT, P,
            HV=HV, BT=BT, WB=ds.WARMUP_BLOCK, IS_VARLEN=varlen, FROM_GATES=use_qk_l2norm, num_warps=4,
        )  # fmt: skip
    segment_output_kernel_gluon[(N * HV, triton.cdiv(V, 64), P)](
        q, k, v, beta, p.w, p.u, p.gc, p.kf, p.qf, p.aqk, p.o, cw, p.gc,
        p.final if p.final is not None else p.gc,
        p.cu, T, P, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        H=H, HV=HV, K=K, V=V, BK=p.cfg.BK, BV=64, BT=BT, IS_VARLEN=varlen, HAS_H0=False,
        STORE_FINAL=p.final is not None, WARMUP=P > 1, OVERLAP=overlap, ABLATE=ablate, num_warps=4,
    )  # fmt: skip
    return p.o, p.final
