"""Chunked gated delta rule with the output fused into the recurrence and the sequence split
across programs ("split" design; not the default path, see docs/performance.md).

Launch 1 is the three-launch design's `_chunk_prepare_kernel` (w, u, Aqk and the per-token
factors; `clef_runtime.ops.delta_rule_chunk` has the algebra).  What differs is the rest: the
chunk states are never stored.  A program walks its chunks with the float32 state in registers
and writes each chunk's output as it goes (``o = qf ⊙ (q S_c) + Aqk v_new``), so the 537 MB of
chunk states and the v_new round trip of the three-launch design (B1 T32768 bf16) are gone.

Walking a whole sequence in one program leaves too few programs at B1 (32 value heads × V
blocks) and a long chain, so each sequence is cut into ``P`` segments of whole chunks.  The
chunk step is affine in the state:

    S_end = e^{G_L} S + kᵀ (kf ⊙ (u - w S)) = M_c S + kᵀ (kf ⊙ u),   M_c = e^{G_L} I - kᵀ diag(kf) w

so a segment maps its start state by ``S_end = M_s S_start + L_s``, with ``M_s`` the product of
its chunks' ``M_c`` (K×K) and ``L_s`` the segment's end state from a zero start.  Both come from
the same chunk step: ``L_s`` by stepping [u] from 0, ``M_s`` by stepping 0 (no u) from I.  Hence:

2. `_segment_map_kernel`, grid ``(N·HV, (V + K) / BV, P - 1)``: for every segment but the last,
   ``[L_s | M_s]`` (``V + K`` columns, BV at a time: a column block is a V block of L or a K
   block of M) into a float32 buffer.
3. `_segment_output_kernel`, grid ``(N·HV, V / BV, P)``: a program first folds the maps of the
   segments before its own onto the initial state (``S ← M_s S + L_s``: at most P - 1 dots of
   K×K by K×BV, float32 at TF32 for 16-bit inputs, IEEE for float32), then walks its segment's
   chunks as the three-launch design's recurrence does, with the output fused; the last
   segment's program stores the final state.

Exact, not an approximation: the segments differ from a single walk only in the rounding of the
state (bf16 state dots round ``S`` per step either way).  With ``P = 1`` launch 2 is skipped and
launch 3 is the plain fused recurrence.  Segments hold ``ceil(chunks / P)`` chunks of their
sequence (varlen: per sequence; an empty segment maps by ``[0 | I]``).

Tensor-core configuration only: the FMA path (float32, the V100's f16) keeps the three-launch
design, whose FMA tiles were sized for sm70's registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreted
from clef_runtime.ops.delta_rule_chunk import BT, OP, checked_inputs, prepare
from clef_runtime.ops.delta_rule_common import rne_bf16, tensor_core_dots

# Launches 2 and 3 take the whole V = 128 per program (k, w, q and Aqk are then read once per
# chunk and value head, not once per V block), 8 warps, 2 stages (3 need 254 KB of shared memory).
# Measured on the H200 (docs/performance.md, "Split design"): 32-wide blocks at 4 warps were
# 1.3-1.6× slower, 64-wide at 8 warps in between.
SPLIT_BV = 128
SPLIT_WARPS = 8
SPLIT_STAGES = 2
# With whole-V programs one program fills an SM's registers: at ≥ 128 (sequence, value head)
# chains the unsplit walk already occupies the GPU, and splitting only adds the maps' work.
UNSPLIT_PROGRAMS = 128
TARGET_PROGRAMS = 256  # below that, segments enough for this many programs (two per SM)
MIN_SEGMENT_CHUNKS = 16  # below this a segment's map costs more than its walk saves
MAX_SEGMENTS = 16
# The default path takes this design (segments = 1) for bf16 on tensor cores from this many
# (sequence, value head) chains: measured faster there (B4 T8192, 8 packed × 4096); at B1 the
# three-launch design stays faster at any segment count.
DEFAULT_MIN_CHAINS = 128


def default_segments(N: int, HV: int, V: int, T: int, block_v: int = SPLIT_BV) -> int:
    """Segments per sequence: one when the unsplit walk has enough programs, else enough for
    TARGET_PROGRAMS, none shorter than MIN_SEGMENT_CHUNKS chunks on average (host arithmetic
    only: no sync on cu_seqlens)."""
    programs = N * HV * triton.cdiv(V, block_v)
    if programs >= UNSPLIT_PROGRAMS:
        return 1
    want = triton.cdiv(TARGET_PROGRAMS, max(1, programs))
    per_seq_chunks = triton.cdiv(T, BT) // max(1, N)
    room = max(1, per_seq_chunks // MIN_SEGMENT_CHUNKS)
    return int(max(1, min(want, room, MAX_SEGMENTS)))


def takes_default_path(dtype: torch.dtype, tensor_cores: bool, N: int, HV: int, K: int, V: int) -> bool:
    """Whether `chunk_gated_delta_rule` hands a call to this design (unsplit): bf16 on tensor
    cores, head dims ≤ 128 (one 128-wide tile), at least DEFAULT_MIN_CHAINS chains.  f16 keeps
    the three-launch design (its float32 state operands would spill at these tiles)."""
    return dtype == torch.bfloat16 and tensor_cores and max(K, V) <= 128 and N * HV >= DEFAULT_MIN_CHAINS


@triton.jit
def _seq_bounds(n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
    """(batch row, first token, end) of sequence n, offsets clamped to [0, T] (unchecked bad
    offsets on a GPU give wrong numbers, never a wild access)."""
    if IS_VARLEN:
        b = n * 0
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + n).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + n + 1).to(tl.int64), bos), T)
    else:
        b = n
        bos = n * 0
        eos = n * 0 + T
    return b, bos, eos


@triton.jit
def _split_step(
    S,
    t0,
    eos,
    k_p,
    w_p,
    u_p,
    gc_p,
    kf_p,
    q_p,
    qf_p,
    aqk_p,
    o_p,
    ncols,
    use_u,
    skt,
    sqt,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    OUTPUT: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """One chunk from its start state S (columns of one block); with OUTPUT, the chunk's output
    rows for these columns are stored.  Returns the state at the chunk end."""
    n_live = eos - t0
    r = tl.arange(0, BT)
    live = r < n_live
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    kmask = live[:, None] & (rk < K)[None, :]
    vmask = live[:, None] & (rv < ncols)[None, :]
    gl = tl.load(gc_p + t0 + tl.minimum(n_live, BT) - 1)  # decay to the chunk end
    kfac = tl.load(kf_p + t0 + r, mask=live, other=0.0)
    kc = tl.load(k_p + t0 * skt + r[:, None] * skt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
    wc = tl.load(w_p + t0 * (HV * K) + r[:, None] * (HV * K) + rk[None, :], mask=kmask, other=0.0).to(
        STATE_DT
    )
    uc = tl.load(u_p + t0 * (HV * V) + r[:, None] * (HV * V) + rv[None, :], mask=vmask & use_u, other=0.0).to(
        tl.float32
    )
    Sd = S.to(STATE_DT)
    if ROUND_BF16:
        Sd = rne_bf16(Sd)
    v_new = uc - tl.dot(wc, Sd, input_precision=STATE_PRECISION)
    vk = (v_new * kfac[:, None]).to(STATE_DT)
    if ROUND_BF16:
        vk = rne_bf16(vk)
    if OUTPUT:
        vd = v_new.to(STATE_DT)
        if ROUND_BF16:
            vd = rne_bf16(vd)
        qfac = tl.load(qf_p + t0 + r, mask=live, other=0.0)
        qc = tl.load(q_p + t0 * sqt + r[:, None] * sqt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
        a_mask = live[:, None] & (r[None, :] <= r[:, None])  # launch 1 wrote the causal part only
        Ac = tl.load(aqk_p + t0 * (HV * BT) + r[:, None] * (HV * BT) + r[None, :], mask=a_mask, other=0.0)
        oc = qfac[:, None] * tl.dot(qc, Sd, input_precision=STATE_PRECISION) + tl.dot(
            Ac.to(STATE_DT), vd, input_precision=STATE_PRECISION
        )
        if ROUND_BF16:
            oc = rne_bf16(oc)
        tl.store(
            o_p + t0 * (HV * V) + r[:, None] * (HV * V) + rv[None, :], oc.to(o_p.dtype.element_ty), mask=vmask
        )
    return S * tl.exp(gl) + tl.dot(tl.trans(kc), vk, input_precision=STATE_PRECISION)


# fmt: off
@triton.jit
def _walk(
    S, t_lo, t_hi, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    OUTPUT: tl.constexpr, STATE_DT: tl.constexpr, STATE_PRECISION: tl.constexpr, ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """`_split_step` over the chunks of tokens [t_lo, t_hi) from state S; returns the state at
    t_hi.  Both launches walk through here (inlined on a GPU: the same machine code as the walk
    written out in each kernel, compared with cuobjdump for sm_90)."""
    if INTERPRETED:  # Triton 3.6's interpreter cannot take a runtime range bound (numpy ≥ 2)
        t0 = t_lo
        while t0 < t_hi:
            S = _split_step(
                S, t0, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
                HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16,
            )  # fmt: skip
            t0 += BT
    else:
        # a for loop, so the compiler can pipeline the next chunk's loads behind this one's dots
        for c in range(0, tl.cdiv(t_hi - t_lo, BT)):
            S = _split_step(
                S, t_lo + c * BT, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
                HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16,
            )  # fmt: skip
    return S
# fmt: on


@triton.jit(do_not_specialize=["T", "P"])
def _segment_map_kernel(
    k,
    w,
    u,
    gc,
    kf,
    emap,
    cu_seqlens,
    T,
    P,
    skb,
    skt,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    CW: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """[L_s | M_s] of segment s (< P - 1) of one sequence and value head, one column block."""
    i_nh = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    s = tl.program_id(2).to(tl.int64)
    n = i_nh // HV
    hv = i_nh % HV
    h = hv // (HV // H)
    b, bos, eos = _seq_bounds(n, cu_seqlens, T, IS_VARLEN)
    nvb = tl.cdiv(V, BV)
    is_l = j < nvb  # a V block of L_s (steps u from 0), else a K block of M_s (steps 0 from I)
    c0 = tl.where(is_l, j * BV, (j - nvb) * BV)
    ncols = tl.where(is_l, V - c0, K - c0)

    k_p = k + b * skb + h * K
    tok = b * T * HV + hv
    hd = (b * HV + hv) * T
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    S = tl.where((rk[:, None] == (c0 + rv)[None, :]) & (j >= nvb), 1.0, 0.0).to(tl.float32)

    seg = tl.cdiv(tl.cdiv(eos - bos, BT), P)  # chunks per segment
    t_lo = tl.minimum(bos + s * seg * BT, eos)
    t_hi = tl.minimum(bos + (s + 1) * seg * BT, eos)
    S = _walk(
        S, t_lo, t_hi, eos, k_p, w + tok * K, u + tok * V + c0, gc + hd, kf + hd, k_p, gc, gc, gc,
        ncols, is_l, skt, skt,
        HV, K, V, BK, BV, BT, False, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED,
    )  # fmt: skip
    e_p = emap + ((n * (P - 1) + s) * HV + hv) * (K * CW) + j * BV
    tl.store(e_p + rk[:, None] * CW + rv[None, :], S, mask=(rk < K)[:, None] & (rv < ncols)[None, :])


@triton.jit(do_not_specialize=["T", "P"])
def _segment_output_kernel(
    q,
    k,
    w,
    u,
    gc,
    kf,
    qf,
    aqk,
    o,
    emap,
    h0,
    ht,
    cu_seqlens,
    T,
    P,
    sqb,
    sqt,
    skb,
    skt,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    CW: tl.constexpr,
    VP: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    FOLD_PRECISION: tl.constexpr,
    FOLD: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Segment s of one sequence, value head and V block: its start state from the segment maps
    before it, then its chunks with the output fused."""
    i_nh = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    s = tl.program_id(2).to(tl.int64)
    n = i_nh // HV
    hv = i_nh % HV
    h = hv // (HV // H)
    b, bos, eos = _seq_bounds(n, cu_seqlens, T, IS_VARLEN)
    c0 = j * BV
    ncols = V - c0

    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    s_off = rk[:, None] * V + rv[None, :]
    s_mask = (rk < K)[:, None] & (rv < ncols)[None, :]
    h0 += i_nh * K * V + c0
    ht += i_nh * K * V + c0
    S = tl.load(h0 + s_off, mask=s_mask, other=0.0) if HAS_H0 else tl.zeros([BK, BV], dtype=tl.float32)
    if FOLD:  # fold the maps of the segments before this one: S ← M S + L
        e_p = emap + (n * (P - 1) * HV + hv) * (K * CW)
        m_mask = (rk < K)[:, None] & (rk < K)[None, :]
        sp = s * 0
        while sp < s:  # (a while loop: the interpreter cannot take a runtime range bound)
            Mt = tl.load(e_p + rk[:, None] * CW + VP + rk[None, :], mask=m_mask, other=0.0)
            Lt = tl.load(e_p + rk[:, None] * CW + c0 + rv[None, :], mask=s_mask, other=0.0)
            S = tl.dot(Mt, S, input_precision=FOLD_PRECISION) + Lt
            e_p += HV * (K * CW)
            sp += 1

    k_p = k + b * skb + h * K
    q_p = q + b * sqb + h * K
    tok = b * T * HV + hv
    hd = (b * HV + hv) * T
    w_p = w + tok * K
    u_p = u + tok * V + c0
    o_p = o + tok * V + c0
    aqk_p = aqk + tok * BT
    seg = tl.cdiv(tl.cdiv(eos - bos, BT), P)
    t_lo = tl.minimum(bos + s * seg * BT, eos)
    t_hi = tl.minimum(bos + (s + 1) * seg * BT, eos)
    S = _walk(
        S, t_lo, t_hi, eos, k_p, w_p, u_p, gc + hd, kf + hd, q_p, qf + hd, aqk_p, o_p,
        ncols, True, skt, sqt,
        HV, K, V, BK, BV, BT, True, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED,
    )  # fmt: skip
    if STORE_FINAL:
        tl.store(ht + s_off, S, mask=s_mask & (s == P - 1))


def chunk_gated_delta_rule_split(
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
    segments: int | None = None,
    block_v: int = SPLIT_BV,
    warps: int = SPLIT_WARPS,
    stages: int = SPLIT_STAGES,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked delta rule in the split design (same contract as
    `clef_runtime.ops.delta_rule_chunk.chunk_gated_delta_rule`).  ``segments``: per sequence
    (None: `default_segments`); ``block_v``, ``warps``: launches 2 and 3's column block and warps
    (for measurements; the defaults are the kept ones).  Raises ValueError where the device takes the FMA
    configuration (float32, sm70): that path has the three-launch design only."""
    _, T, H, HV, K, V, N, scale = checked_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    if not tensor_core_dots(q.dtype, q.device):
        raise ValueError(f"{OP}: the split design runs on tensor cores only (16-bit inputs, sm80+)")
    P = default_segments(N, HV, V, T, block_v) if segments is None else int(segments)
    if P < 1:
        raise ValueError(f"{OP}: segments must be ≥ 1, got {P}")
    device = q.device
    p = prepare(q, k, v, g, beta, N, scale, cu_seqlens, use_qk_l2norm, output_final_state, True)
    policy, cfg = p.policy, p.cfg
    varlen = cu_seqlens is not None
    BV = min(block_v, cfg.BVF)
    nvb, nkb = triton.cdiv(V, BV), triton.cdiv(K, BV)
    VP, CW = nvb * BV, (nvb + nkb) * BV
    emap = torch.empty(max(1, N * (P - 1)), HV, K, CW, dtype=torch.float32, device=device)
    consts = dict(
        H=H, HV=HV, K=K, V=V, BK=cfg.BK, BV=BV, BT=BT, CW=CW, IS_VARLEN=varlen,
        STATE_DT=policy.state_dtype, STATE_PRECISION=policy.state_precision, ROUND_BF16=policy.round_bf16,
    )  # fmt: skip
    if P > 1:
        _segment_map_kernel[(N * HV, nvb + nkb, P - 1)](
            k, p.w, p.u, p.gc, p.kf, emap, p.cu, T, P, k.stride(0), k.stride(1),
            **consts, INTERPRETED=interpreted(_segment_map_kernel),
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    fold = "ieee" if q.dtype == torch.float32 else "tf32"
    _segment_output_kernel[(N * HV, nvb, P)](
        q, k, p.w, p.u, p.gc, p.kf, p.qf, p.aqk, p.o, emap,
        initial_state if initial_state is not None else p.gc,
        p.final if p.final is not None else p.gc,
        p.cu, T, P, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        **consts, VP=VP, HAS_H0=initial_state is not None, STORE_FINAL=p.final is not None,
        FOLD_PRECISION=fold, FOLD=P > 1, INTERPRETED=interpreted(_segment_output_kernel),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return p.o, p.final
