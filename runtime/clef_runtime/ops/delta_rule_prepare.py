"""Chunked delta-rule prefill, launch 1: the input checks (`checked_inputs`) and everything in a
chunk that does not need the state (`_chunk_prepare_kernel`, run by `prepare`, at the tiles of
`delta_rule_config.launch_config`).  Both designs start here: the three-launch one
(`delta_rule_chunk`) and the split one (`delta_rule_chunk_split`); how the whole op works is in
`delta_rule_chunk`'s docstring."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreted
from clef_runtime.ops._common import cdiv, check_cu_seqlens, check_runnable, sm_count
from clef_runtime.ops.delta_rule_common import (
    DotPolicy,
    check_gdn_inputs,
    check_state,
    dot_policy,
    l2_prefetch,
    pow2_at_least,
    rne_bf16,
    seq_bounds,
    warmup_start,
)
from clef_runtime.ops.delta_rule_config import LaunchConfig, launch_config
from clef_runtime.ops.delta_rule_plan import Recorder, Spec, carve, plain_launch

OP = "chunk_gated_delta_rule"
BT = 64  # chunk length
_TORCH_DTYPE = {tl.bfloat16: torch.bfloat16, tl.float16: torch.float16, tl.float32: torch.float32}
BC = 16  # sub-block of the triangular solve (the smallest tl.dot tile)
# launch 1 asks L2 for the rows of the chunk slot this many on (`_chunk_prepare_kernel`'s
# PREFETCH, where `prefetches` says): on the H100, before its loads of q and k moved ahead of the
# gates' sum, 1-6 slots ahead took launch 1 at B1 T32768 from 327-331 to 290-294 µs, 8 to 293-299,
# 12 to 314-317, 17 and more gained nothing or lost; since, 1 or 4 are within 2 µs of 2 at B1
# T32768 and 8 packed × 4096 (docs/performance.md)
PREFETCH_AHEAD = 2


def prefetches(programs: int, cfg: LaunchConfig, t_out: bool, sms: int, varlen: bool, l2norm: bool) -> bool:
    """Whether launch 1 asks L2 for the rows ahead (PREFETCH).  The split design's launch 1
    (``t_out``) does where its grid is more than one wave of programs, for packed sequences
    (varlen) and for keys it does not normalise.  Within one wave every chunk's own program is
    already loading its rows, so the requests only delay its own loads; and since its loads of q
    and k go out with the gates' (2026-12-07), a dense launch 1 that normalises q and k ran as
    fast or faster without them.  H100, per kernel (docs/performance.md, "Launch 1's L2
    prefetch"): B1 T512 7.8 → 7.0 µs without, T768 10.4 → 9.0; dense with the norm B1 T32768
    286.3 → 285.2, B4 T8192 278.5 → 276.5, T131072 1099.7 → 1096.5; kept: 8 packed × 4096 285.6
    against 295.1 without (252.8 without the norm against 248.1), B4 T8192 without the norm 239.2
    against 242.6.  A wave is four programs an SM at its 128-register cap (65,536 registers an
    SM); without a cap the compiler's count is unknown here and it prefetches.  The three-launch
    design's launch 1 (B1 prompts under 512 tokens, f16, the FMA path) was not measured against
    this and always prefetches."""
    if not t_out or cfg.regs1_t is None:
        return True
    if l2norm and not varlen:
        return False
    per_sm = 65536 // (cfg.regs1_t * cfg.warps1 * 32)
    return programs > per_sm * sms


# Kernel bodies are written out rather than split into small @triton.jit helpers: the
# interpreter (how CI runs them) spends ~5 ms on every nested jit call, which would dominate the
# CPU test budget; on a GPU it makes no difference (helpers are inlined).

# ---------------------------------------------------------------------------------------------
# launch 1: everything in a chunk that does not need the state
# ---------------------------------------------------------------------------------------------


@triton.jit
def _slot_bounds(i_t, cu_seqlens, T, NT, N, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(batch row, first token, end of its sequence) of chunk slot `i_t`."""
    if IS_VARLEN:
        # Chunk c of sequence n (tokens from cu[n] + BT·c) owns slot cu[n] // BT + n + c: the
        # slots of one sequence are consecutive and every sequence starts past the previous
        # one's, all below ceil(T / BT) + N.  So a binary search over n of
        # key(n) = cu[n] // BT + n finds a slot's sequence from cu_seqlens alone: no host-side
        # table, no sync.  Slots no chunk owns come out empty (t0 == eos).  Offsets are clamped
        # to [0, T]: unchecked bad ones (on a GPU) give wrong numbers, never a wild access.
        b = (i_t * 0).to(tl.int64)
        lo = i_t * 0
        hi = lo + N - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            key = tl.minimum(tl.maximum(tl.load(cu_seqlens + mid).to(tl.int64), 0), T) // BT + mid
            lo = tl.where(key <= i_t, mid, lo)
            hi = tl.where(key <= i_t, hi, mid - 1)
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + lo).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + lo + 1).to(tl.int64), bos), T)
        t0 = bos + (i_t - bos // BT - lo) * BT
        t0 = tl.where(t0 < bos, eos, t0)
    else:
        b = (i_t // NT).to(tl.int64)
        t0 = ((i_t % NT) * BT).to(tl.int64)
        eos = b * 0 + T
    return b, t0, eos


@triton.jit(do_not_specialize=["T", "NT", "N", "NW", "P"])
def _chunk_prepare_kernel(
    q,
    k,
    v,
    g,
    beta,
    w,
    u,
    aqk,
    gc,
    kf,
    qf,
    cu_seqlens,
    scale,
    T,
    NT,
    N,
    sqb,
    sqt,
    skb,
    skt,
    svb,
    svt,
    cw,
    warmup_log_bound,
    NW,
    P,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BVF: tl.constexpr,
    KS: tl.constexpr,
    VS: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    LOG_BC: tl.constexpr,
    SOLVE_BY_DOUBLING: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    L2NORM: tl.constexpr,
    CHUNK_DT: tl.constexpr,
    SOLVE_PRECISION: tl.constexpr,
    DOUBLING_PRECISION: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    T_OUT: tl.constexpr = False,
    SOLVE_DT: tl.constexpr = tl.float32,
    WARMUP_PLAN: tl.constexpr = False,
    WB: tl.constexpr = 64,
    WB0: tl.constexpr = 0,
    FAST_EXP: tl.constexpr = False,
    NORM_FROM_GRAM: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    AHEAD: tl.constexpr = 2,
    LINE: tl.constexpr = 64,
    LINES: tl.constexpr = 2,
):
    # a 1-D grid, value heads fastest: the value heads of one key head (and of one chunk) run
    # side by side and share q and k through L2 (the chunk count stays off the 65535-limited
    # grid axes).  The grid holds fewer than 2³¹ programs, so its index and the divisions by
    # runtime counts stay 32-bit (a 64-bit division is a subroutine of ~100 instructions on
    # sm_90); what indexes memory is made 64-bit from them.
    pid = tl.program_id(0)
    if WARMUP_PLAN:
        # the split design's segment starts: the first NW = N·HV·P programs each find where one
        # segment of one sequence and value head warms up from (`delta_rule_common.warmup_start`:
        # from the gates alone for keys this launch normalises, with the keys' norms otherwise),
        # into cw, in place of a launch of their own (a launch's host time, and it would wait for
        # this one); the chunks' programs follow
        if pid < NW:
            i_nh = pid // P
            s = pid % P
            n = (i_nh // HV).to(tl.int64)
            hv_w = i_nh % HV
            b_w, bos, eos = seq_bounds(n, cu_seqlens, T, IS_VARLEN)
            seg = tl.cdiv(tl.cdiv(eos - bos, BT), P)
            c_lo = tl.minimum(s * seg, tl.cdiv(eos - bos, BT))
            row = b_w * T * HV + hv_w
            k_w = k + b_w * skb + (hv_w // (HV // H)) * K  # the value head's key head
            c_w = warmup_start(
                k_w, skt, g + row, beta + row, c_lo, bos, eos, warmup_log_bound,
                HV, K, BK, BT, WB, L2NORM, WB0,
            )  # fmt: skip
            tl.store(cw + pid, c_w.to(tl.int32))
            return
        pid -= NW
    i_t = pid // HV
    hv = pid % HV
    h = hv // (HV // H)
    b, t0, eos = _slot_bounds(i_t, cu_seqlens, T, NT, N, BT, IS_VARLEN)
    # an empty slot of the varlen grid (t0 ≥ eos) masks every load and store below

    if PREFETCH:
        # the rows of chunk slot i_t + AHEAD, which programs starting a little later take, asked
        # into L2 (q and k by the first value head of each key head, the gates and β by the first
        # of each 128-byte line of them): their loads, a third of this launch's stall cycles
        # (ncu), then find them there or on the way.  Varlen: AHEAD chunks on in the packed
        # token order; rows past T are clamped to T - 1.
        if IS_VARLEN:
            b_a = b
            t_a = t0 + AHEAD * BT
        else:
            b_a = ((i_t + AHEAD) // NT).to(tl.int64)
            t_a = (((i_t + AHEAD) % NT) * BT).to(tl.int64)
        if (b_a < N) & (t_a < T):
            ra = tl.arange(0, 2 * BT)
            rows = tl.minimum(t_a + ra % BT, T - 1)
            if hv % (HV // H) == 0:
                qk = tl.where(ra < BT, q + b_a * sqb + rows * sqt, k + b_a * skb + rows * skt) + h * K
                l2_prefetch(qk[:, None] + (tl.arange(0, LINES) * LINE)[None, :])
            if hv % 32 == 0:
                l2_prefetch(tl.where(ra < BT, g, beta) + (b_a * T + rows) * HV + hv)

    # 64-bit scalar bases, 32-bit per-element offsets: int64 offset tiles would cost two
    # registers per element
    q += b * sqb + t0 * sqt + h * K
    k += b * skb + t0 * skt + h * K
    v += b * svb + t0 * svt + hv * V
    tok0 = (b * T + t0) * HV + hv  # first row of the [B, T, HV, ...] tensors in this chunk
    g += tok0
    beta += tok0
    hd0 = (b * HV + hv) * T + t0  # the same in the head-major [B, HV, T] cumulative decays
    gc += hd0
    # the per-token factors by chunk slot, [B, HV, NS, BT] with NS slots a batch row: every
    # chunk's 64 start at a multiple of 64 floats (the split design's walk takes them by TMA,
    # which needs 16-byte aligned starts, also where a packed sequence's chunks start anywhere)
    NS = NT + N if IS_VARLEN else NT
    fd0 = ((b * HV + hv) * NS + i_t - b * NS) * BT
    kf += fd0
    qf += fd0
    w += tok0 * K
    u += tok0 * V
    aqk += tok0 * BT

    r = tl.arange(0, BT)
    n_live = eos - t0
    live = r < n_live
    # every load up front, the first K slice of k and q (their whole rows on tensor cores) right
    # after the gates: the cumulative sum below waits on the gates, and its store and barriers
    # held the loads of q and k back until then (sm_90 SASS)
    gv = tl.load(g + r * HV, mask=live, other=0.0)
    bv = tl.load(beta + r * HV, mask=live, other=0.0)
    cols0 = tl.arange(0, KS)
    m0 = live[:, None] & (cols0 < K)[None, :]
    ks0 = tl.load(k + r[:, None] * skt + cols0[None, :], mask=m0, other=0.0)
    qs0 = tl.load(q + r[:, None] * sqt + cols0[None, :], mask=m0, other=0.0)
    G = tl.cumsum(gv, 0)  # in-chunk cumulative log-decay, float32
    gl = tl.sum(tl.where(r == tl.minimum(n_live, BT) - 1, G, 0.0), 0)  # to the chunk end
    tl.store(gc + r, G, mask=live)

    # Gram matrices of the raw q and k, K streamed in KS-wide slices: small dot operands keep
    # the FMA path (GPUs without usable tensor cores, or float32) from spilling whole operand
    # rows, and on tensor cores the products of input-dtype values are exact.  The fused L2
    # norm then is a rank-one rescaling: q̂_t·k̂_j = (q_t·k_j) / (|q_t| |k_j|).
    QK = tl.zeros([BT, BT], dtype=tl.float32)
    KK = tl.zeros([BT, BT], dtype=tl.float32)
    ssq = tl.zeros([BT], dtype=tl.float32)
    ssk = tl.zeros([BT], dtype=tl.float32)
    diag = r[:, None] == r[None, :]
    for c0 in tl.static_range(0, BK, KS):
        if c0 == 0:
            ks = ks0
            qs = qs0
        else:
            cols = c0 + tl.arange(0, KS)
            m = live[:, None] & (cols < K)[None, :]
            ks = tl.load(k + r[:, None] * skt + cols[None, :], mask=m, other=0.0)
            qs = tl.load(q + r[:, None] * sqt + cols[None, :], mask=m, other=0.0)
        if L2NORM and not NORM_FROM_GRAM:
            k32 = ks.to(tl.float32)
            ssk += tl.sum(k32 * k32, 1)
            q32 = qs.to(tl.float32)
            ssq += tl.sum(q32 * q32, 1)
        kst = tl.trans(ks.to(CHUNK_DT))
        KK = tl.dot(ks.to(CHUNK_DT), kst, KK, input_precision="ieee")
        QK = tl.dot(qs.to(CHUNK_DT), kst, QK, input_precision="ieee")
        if L2NORM and NORM_FROM_GRAM:
            # |q_t|² on the diagonal of q·qᵀ, one more tensor-core dot, already in the Gram
            # tiles' layout: the squares and row sums above, and moving the sums into that
            # layout, cost ~430 more sm_90 instructions a program (the dot's products of 16-bit
            # values are exact in float32, like the squares)
            QQ = tl.dot(qs.to(CHUNK_DT), tl.trans(qs.to(CHUNK_DT)), input_precision="ieee")
            ssq += tl.sum(tl.where(diag, QQ, 0.0), 1)
    if L2NORM and NORM_FROM_GRAM:
        ssk = tl.sum(tl.where(diag, KK, 0.0), 1)  # |k_t|², likewise
    if L2NORM:  # the opset's l2norm: x * rsqrt(sum(x²) + 1e-6), in float32
        rk = tl.rsqrt(ssk + 1e-6)
        rq = tl.rsqrt(ssq + 1e-6)
    else:
        rk = tl.full([BT], 1.0, dtype=tl.float32)
        rq = tl.full([BT], 1.0, dtype=tl.float32)
    # the per-token factors launches 2 and 3 apply to the raw k and q rows, so that neither
    # reduces a row nor exponentiates: the L2 norm and the decay to the chunk end (k, exponent
    # ≤ 0) or from the chunk start (q, with the scale)
    tl.store(kf + r, rk * tl.exp(gl - G), mask=live)
    tl.store(qf + r, (scale * rq) * tl.exp(G), mask=live)
    if T_OUT:
        # the split design's walk forms w and u itself from T diag(β), k, v and factors: w's row
        # factors without β, e^{G} / |k| (e^{G} ≤ 1: the decay from the chunk start), in u's
        # place by chunk slot as kf (stored here, before the solve, so that their addresses take
        # no registers through it)
        tl.store(u - tok0 * V + fd0 + r, tl.exp(G) * rk, mask=live)
    else:
        wf = bv * tl.exp(G) * rk  # w's row factors, β e^{G} / |k|

    causal = r[:, None] >= r[None, :]
    # e^{G_t - G_j} / |k_j| for j ≤ t (exponent ≤ 0): the decay and the key norm both products
    # below take
    if FAST_EXP:
        # 2^x by one MUFU.EX2, subnormal results flushed to zero (a decay below 2⁻¹²⁶ is zero
        # for these sums); above the diagonal the exponent is positive and the result dropped
        G2 = G * 1.4426950408889634
        e2 = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [G2[:, None] - G2[None, :]],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
        decay = tl.where(causal, e2, 0.0) * rk[None, :]
    else:
        # the upper triangle is zeroed before exp
        decay = tl.where(causal, tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0)), 0.0) * rk[None, :]

    # Aqk = scale (q̂ k̂ᵀ ⊙ decay), causal with the diagonal: the in-chunk part of the output
    a_qk = QK * (scale * rq)[:, None] * decay
    if ROUND_BF16:
        a_qk = rne_bf16(a_qk)
    tl.store(aqk + r[:, None] * (HV * BT) + r[None, :], a_qk.to(aqk.dtype.element_ty), mask=live[:, None])

    # A = β k̂ k̂ᵀ ⊙ decay, strictly lower, float32: A = diag(β) Λ
    strict = r[:, None] > r[None, :]
    if T_OUT:
        # the split design's walk takes T diag(β), so that its step loads no β.  Here `A` holds Λ
        # and β enters twice below: in the diagonal blocks N (by rows) and in D⁻¹ diag(β).
        A = tl.where(strict, KK * rk[:, None] * decay, 0.0)
        N_src = A * bv[:, None]
    else:
        A = tl.where(strict, KK * (bv * rk)[:, None] * decay, 0.0)
        N_src = A

    # T = (I + A)⁻¹.  Split A = N + L into its 16×16 diagonal blocks N and the strictly
    # block-lower rest L, D = I + N.  The four D_bb are inverted by blocked forward substitution
    # (or doubling), all four blocks at once; then with M = D⁻¹ L, which is nilpotent (M⁴ = 0 for
    # four blocks), T = (I + M)⁻¹ D⁻¹ = (I - M + M² - M³) D⁻¹ = D⁻¹ - W + M² (D⁻¹ - W) with
    # W = M D⁻¹: four 64×64 dots, W and M² side by side, so three deep (four deep as
    # (I - M)(I + M²) D⁻¹: launch 1 at B1 T32768 451 → 421 µs on the H200, the same errors).
    # Neither step is a power series inside a block: with repeated keys and β → 1 its
    # alternating sums would cancel catastrophically (test_repeated_keys_full_beta_no_decay).
    NB: tl.constexpr = BT // BC
    blk = r // BC
    same_blk = blk[:, None] == blk[None, :]
    Nd = tl.sum(tl.reshape(tl.where(same_blk, N_src, 0.0), [NB, BC, NB, BC]), 2)  # [NB, BC, BC]
    ri = tl.arange(0, BC)
    eye_c = (ri[:, None] == ri[None, :]).to(tl.float32)
    if SOLVE_BY_DOUBLING:
        # Tensor-core GPUs: double the block size.  With X the inverse of D's b×b diagonal
        # blocks and L_b the entries of N that join two neighbouring b-blocks into a 2b-block,
        #     [[D1, 0], [L21, D2]]⁻¹ = [[X1, 0], [-X2 L21 X1, X2]],   i.e.   X ← X - X L_b X,
        # for b = 2, 4, 8: six small batched dots with a dependency chain of six, where the
        # row-by-row form below has fifteen.  On the FMA path (sm70) it spills far more, so that
        # keeps the row form.
        # b = 1: the 1×1 blocks of D are 1, so the 2×2 blocks' inverses are I - N on them
        X = eye_c[None, :, :] - tl.where(((ri // 2)[:, None] == (ri // 2)[None, :])[None, :, :], Nd, 0.0)
        for lvl in tl.static_range(1, LOG_BC):
            joins = ((ri >> (lvl + 1))[:, None] == (ri >> (lvl + 1))[None, :]) & (
                (ri >> lvl)[:, None] != (ri >> lvl)[None, :]
            )
            Lb = tl.where(joins[None, :, :], Nd, 0.0)
            # On tensor cores (`doubling_precision`): 3xTF32 (split-float32) keeps float32
            # accuracy here (the inverse's error ≤ 2.7e-8, hack/solve_precision_emulation.py) and
            # replaced 768 of the 880 FMAs per thread of the IEEE form (launch 1 902 → 813 µs on
            # the H200); bf16 takes plain TF32, whose error stays below the bf16 rounding of T
            # (launch 1 569 → 453 µs on the H200).
            # (SOLVE_DT f16: see `LaunchConfig.solve_dt`; float32: the casts do nothing)
            Xs = X.to(SOLVE_DT)
            Xl = tl.dot(Xs, Lb.to(SOLVE_DT), input_precision=DOUBLING_PRECISION).to(SOLVE_DT)
            X = X - tl.dot(Xl, Xs, input_precision=DOUBLING_PRECISION)
    else:
        X = tl.zeros([NB, BC, BC], dtype=tl.float32) + eye_c[None, :, :]
        for i in range(1, BC):
            # row i of each block becomes e_i - Σ_{j<i} N_ij X_j: rows j < i of X are final and
            # N_ij = 0 for j ≥ i, so row i of the batched product N X is exactly that sum (one
            # small dot per step instead of two cross-lane reductions)
            X = tl.where(
                (ri == i)[None, :, None], eye_c[None, :, :] - tl.dot(Nd, X, input_precision="ieee"), X
            )
    rb = tl.arange(0, NB)
    if T_OUT:
        # T diag(β) = (I + M)⁻¹ D⁻¹ diag(β), and M = D⁻¹ L = (D⁻¹ diag(β)) Λ off the diagonal
        # blocks: both from D⁻¹ diag(β), the blocks' columns scaled (β loaded again in their
        # layout, an L1 hit: β held from above, or T's 64 columns scaled at the end, spilled
        # 56-256 bytes more at launch 1's register cap on sm_90)
        tok = rb[:, None, None] * BC + ri[None, None, :]
        X = X * tl.load(beta + tok * HV, mask=tok < n_live, other=0.0)
    eye_b = (rb[:, None] == rb[None, :]).to(tl.float32)
    Dinv = tl.reshape(X[:, :, None, :] * eye_b[:, None, :, None], [BT, BT])
    Ds = Dinv.to(SOLVE_DT)
    M = tl.dot(Ds, tl.where(same_blk, 0.0, A).to(SOLVE_DT), input_precision=SOLVE_PRECISION).to(SOLVE_DT)
    W = tl.dot(M, Ds, input_precision=SOLVE_PRECISION)
    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION).to(SOLVE_DT)
    Tm = Dinv - W + tl.dot(M2, (Dinv - W).to(SOLVE_DT), input_precision=SOLVE_PRECISION)
    # the WY products run on tensor cores: T rounded to the dot dtype
    Tm = Tm.to(CHUNK_DT)
    if ROUND_BF16:
        Tm = rne_bf16(Tm)

    # w = T (β e^{G} k̂) and u = T (β v), in KS/VS-wide column slices
    if T_OUT:
        # (`delta_rule_chunk_split`: a quarter of w and u's bytes, and no w/u pass here)
        # T in w's place ([B, T, HV, BT], like Aqk)
        t_p = w + tok0 * (BT - K)
        tl.store(t_p + r[:, None] * (HV * BT) + r[None, :], Tm.to(w.dtype.element_ty), mask=live[:, None])
    else:
        for c0 in tl.static_range(0, BK, KS):
            cols = c0 + tl.arange(0, KS)
            m = live[:, None] & (cols < K)[None, :]
            kb = (
                tl.load(k + r[:, None] * skt + cols[None, :], mask=m, other=0.0).to(tl.float32) * wf[:, None]
            ).to(CHUNK_DT)
            if ROUND_BF16:
                kb = rne_bf16(kb)
            ws = tl.dot(Tm, kb, input_precision="ieee")
            if ROUND_BF16:
                ws = rne_bf16(ws)
            tl.store(w + r[:, None] * (HV * K) + cols[None, :], ws.to(w.dtype.element_ty), mask=m)
        for c0 in tl.static_range(0, BVF, VS):
            cols = c0 + tl.arange(0, VS)
            m = live[:, None] & (cols < V)[None, :]
            vb = (
                tl.load(v + r[:, None] * svt + cols[None, :], mask=m, other=0.0).to(tl.float32) * bv[:, None]
            ).to(CHUNK_DT)
            if ROUND_BF16:
                vb = rne_bf16(vb)
            us = tl.dot(Tm, vb, input_precision="ieee")
            if ROUND_BF16:
                us = rne_bf16(us)
            tl.store(u + r[:, None] * (HV * V) + cols[None, :], us.to(u.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------


def checked_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> tuple[int, int, int, int, int, int, int, float]:
    """Every input check of the op; returns (B, T, H, HV, K, V, sequences N, scale)."""
    B, T, H, HV, K, V = check_gdn_inputs(OP, q, k, v, g, beta)
    device = q.device
    check_runnable(OP, device)
    N = B if cu_seqlens is None else check_cu_seqlens(OP, cu_seqlens, B, T, device)
    if initial_state is not None:
        check_state(OP, "initial_state", initial_state, N, HV, K, V)
        if initial_state.device != device:
            raise ValueError(f"{OP}: initial_state is on {initial_state.device} but q is on {device}")
    return B, T, H, HV, K, V, N, K**-0.5 if scale is None else float(scale)


@dataclass(frozen=True)
class Prepared:
    """Launch 1's outputs, the output buffers, and what the later launches need to know."""

    o: torch.Tensor
    final: torch.Tensor | None
    w: torch.Tensor
    u: torch.Tensor
    aqk: torch.Tensor
    gc: torch.Tensor
    kf: torch.Tensor
    qf: torch.Tensor
    cu: torch.Tensor  # cu_seqlens, or an unused pointer when not varlen
    NT: int
    slots: int
    NS: int  # chunk slots a batch row (the per-token factors are [B, HV, NS, BT])
    policy: DotPolicy
    cfg: LaunchConfig
    extra: tuple[torch.Tensor | None, ...] = ()  # the caller's `extra` workspace tensors


def doubling_precision(policy: DotPolicy) -> str:
    """input_precision of launch 1's doubling dots (the 16×16 diagonal blocks' inverses): TF32
    where T is rounded to bf16 for its dots (TF32's error is below that rounding: against the
    float64 reference on the H200, random inputs and runs of equal keys with β = 1, no larger
    than with 3xTF32), 3xTF32 otherwise (f16 rounds T to 11 bits, as fine as TF32 itself)."""
    return "tf32" if policy.chunk_dtype == tl.bfloat16 else "tf32x3"


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    N: int,
    scale: float,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm: bool,
    output_final_state: bool,
    tc: bool,
    t_out: bool = False,
    extra: tuple[Spec | None, ...] = (),
    rec: Recorder | None = None,
    warmup_plan: tuple[int, float, int, int] | None = None,
) -> Prepared:
    """Allocate the outputs and launch 1's intermediates, and run launch 1 (shared with
    `clef_runtime.ops.delta_rule_chunk_split`; ``t_out``: `Prepared.w` holds each chunk's
    ``T diag(β)`` ``[B, T, HV, BT]`` and `Prepared.u` the float32 factors ``e^{G} / |k|`` by chunk
    slot (as kf), from which that walk forms w and u; with ``warmup_plan`` = (P, log bound, chunks
    a step back, chunks of the first step back or 0: `delta_rule_common.warmup_start`) its first
    N·HV·P programs also store each segment's warm-up start (the split design's segments) into
    the caller's first `extra` tensor, int32 [N·HV·P])."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    device = q.device
    NT = cdiv(T, BT)
    slots = B * NT if cu_seqlens is None else NT + N  # varlen: an upper bound, see the kernel
    NS = slots // B
    # per-token float32 factors by chunk slot, [B, HV, NS, BT] (each chunk's 64 contiguous and
    # 256-byte aligned; a varlen batch's unused slots are never written nor read)
    factor_rows = (B, HV, NS * BT)
    f32 = torch.float32
    # launch 1's intermediates and the caller's `extra` (one workspace allocation in a plan,
    # `delta_rule_plan`): within-chunk intermediates, token-indexed, in the
    # input dtype (see the module docstring); the cumulative decay, head-major [B, HV, T]; what
    # launches 2 and 3 scale k and q rows by
    specs: tuple[Spec | None, ...] = (
        ((B, T, HV, BT if t_out else K), q.dtype),  # w (T with t_out)
        (factor_rows, f32) if t_out else ((B, T, HV, V), q.dtype),  # u (w's row factors with t_out)
        ((B, T, HV, BT), q.dtype),  # aqk
        ((B, HV, T), f32),  # gc
        (factor_rows, f32),  # kf
        (factor_rows, f32),  # qf
        *extra,
    )
    views = carve(specs, device, rec)
    w, u, aqk, gc, kf, qf = views[:6]
    assert w is not None and u is not None and aqk is not None and gc is not None
    assert kf is not None and qf is not None
    cu = cu_seqlens if cu_seqlens is not None else gc  # an unused pointer when not varlen
    policy = dot_policy(q.dtype, _chunk_prepare_kernel, tc)
    cfg = launch_config(K, V, q.dtype, tc)
    P, log_bound, wb, wb0 = warmup_plan if warmup_plan is not None else (1, 0.0, 64, 0)
    NW = N * HV * P if warmup_plan is not None else 0  # the warm-up programs ahead of the chunks'
    cw = views[6] if NW else gc
    assert cw is not None
    if T > 0:
        programs = slots * HV + NW
        compiled = not interpreted(_chunk_prepare_kernel)
        # the first long kernel goes into the queue before the outputs are allocated
        plain_launch(
            rec, _chunk_prepare_kernel, (programs,),
            (
                q, k, v, g, beta, w, u, aqk, gc, kf, qf, cu,
                scale, T, NT, N,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                cw, log_bound, NW, P,
            ),
            dict(
                H=H, HV=HV, K=K, V=V, BK=cfg.BK, BVF=cfg.BVF, KS=cfg.KS, VS=cfg.VS,
                BT=BT, BC=BC, LOG_BC=BC.bit_length() - 1, SOLVE_BY_DOUBLING=cfg.solve_by_doubling,
                IS_VARLEN=cu_seqlens is not None, L2NORM=use_qk_l2norm,
                CHUNK_DT=policy.chunk_dtype, SOLVE_PRECISION=policy.solve_precision,
                DOUBLING_PRECISION=doubling_precision(policy), SOLVE_DT=cfg.solve_dt,
                ROUND_BF16=policy.round_bf16, T_OUT=t_out,
                WARMUP_PLAN=warmup_plan is not None, WB=wb, WB0=wb0,
                # the split design's launch 1 only: on the H100 the three-launch one (B1 T512) ran
                # 2% slower with it, the split rows ~1% faster (docs/performance.md)
                FAST_EXP=t_out and compiled,
                # the split design's launch 1 (tensor cores only): the norms from the Gram tiles'
                # diagonals; the FMA path would pay a 64 × 64 × K dot for them
                NORM_FROM_GRAM=t_out,
                # the next chunks' rows into L2 (compiled kernels only: inline PTX)
                PREFETCH=compiled and prefetches(
                    programs, cfg, t_out, sm_count(device), cu_seqlens is not None, use_qk_l2norm
                ),
                AHEAD=PREFETCH_AHEAD,
                LINE=128 // q.element_size(), LINES=pow2_at_least(cdiv(K * q.element_size(), 128), 1),
                num_warps=cfg.warps1,
                maxnreg=cfg.regs1_t if t_out else cfg.regs1,
            ),
        )  # fmt: skip
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=device)
    final = torch.empty(N, HV, K, V, dtype=torch.float32, device=device) if output_final_state else None
    if rec is not None:
        rec.outputs(o, final)
    return Prepared(o, final, w, u, aqk, gc, kf, qf, cu, NT, slots, NS, policy, cfg, tuple(views[6:]))
