"""Chunked gated delta rule with the output fused into the recurrence and the sequence split
across programs ("split" design; the default path for bf16 with many chains or long sequences:
`delta_rule_chunk_split.takes_default_path`, docs/performance.md).

Launch 1 is the three-launch design's `_chunk_prepare_kernel` storing each chunk's
``T diag(β)`` (with ``T = (I + A)⁻¹``) and the factors ``e^{G} / |k|`` in place of w and u
(`clef_runtime.ops.delta_rule_chunk` has the algebra).  What differs is the rest: the chunk
states are never stored.  A program walks its chunks with the float32 state in registers, takes
``v_new = u - w S = T diag(β) (v - (e^{G} k̂) S)`` (w and u are never formed: a quarter of their
bytes, one 64 × 64 × V dot more a step; β rides in T, so the step loads none) and writes each
chunk's output as it goes
(``o = qf ⊙ (q S_c) + Aqk v_new``), so the 537 MB of chunk states and the v_new round trip of the
three-launch design (B1 T32768 bf16) are gone.

Walking a whole sequence in one program leaves too few programs at B1 (32 value heads × V
blocks) and a long chain, so each sequence can be cut into ``P`` segments of whole chunks, one
program each (launch 2, `_segment_output_kernel`, grid ``(N·HV, V / BV, P)``; where each
segment's warm-up starts is found by launch 1's first programs).  A segment needs its true start
state; it gets it from a *warm-up walk* over the chunks before it.  Each token maps the state by
``S ← e^{g} (I - β k̂ k̂ᵀ) S + …``, whose linear part has spectral norm
``e^{g} max(1, |1 - β |k̂|²|)``, so the map of chunks ``c_w .. c_lo - 1`` onto the segment start
has norm at most ``e^{Σ b_c}`` with ``b_c`` the chunk's sum of ``g + log max(1, |1 - β |k̂|²|)``
(with L2-normalised keys ``|k̂|² ≤ 1``, so the gates alone give it: ``max(1, |1 - β|)``;
otherwise the keys' rows give ``|k|²``: `delta_rule_common.chunk_bounds`).  A segment starting at
chunk ``c_lo`` walks back until that sum falls below ``WARMUP_LOG_BOUND = ln 2⁻²⁴``, walks those
chunks from a zero state without writing outputs, then its own chunks with the output.  Starting
from zero instead of the true state there leaves an error of at most ``2⁻²⁴`` times that state's
norm: float32 rounding.  If the sum never falls that low (a head with no decay, or keys whose
``β |k̂|²`` exceeds 2), the warm-up reaches the sequence start and begins from the initial state:
the exact walk, only longer.  So the split is never wrong, only slower when a head barely
decays.  (Joining the segments by their affine maps instead cost as much as the walk itself:
docs/performance.md, "What was tried and why it lost".)

The walk holds its state block transposed (``Sᵀ``, `_walk_step`) so that every dot is (a tile
computed in registers) · (a tile loaded from memory)ᵀ: on Hopper that is a wgmma with its left
operand in registers and its right one in the shared memory the pipelined loads fill, and no
computed tile is copied to shared memory on the step's chain.  Its V blocks, warps and stages
are the GPU's `delta_rule_config.WalkConfig`; on sm_90 its tiles arrive, and the output leaves,
by TMA: each program makes tensor descriptors over its sequence's rows, so rows past the
sequence end read as zeros and are not written, as with masked loads and stores, without their
per-thread address and mask arithmetic.  Each descriptor costs its program ~1,100 cycles before
its first step (made on the device: two GPU-scope fences), so a short unsplit walk in narrow V
blocks loads k's and w's per-token factors rather than making two more (`tma_factors`).

The segments differ from a single walk only in rounding.  With ``P = 1`` there is no warm-up
and the kernel is the plain fused recurrence.  Segments hold ``ceil(chunks / P)`` chunks of their
sequence (varlen: per sequence); the last segment's program stores the final state (an empty
last segment warms up to the sequence end and stores it).

Tensor-core configuration only: the FMA path (float32, the V100's f16) keeps the three-launch
design, whose FMA tiles were sized for sm70's registers.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreted
from clef_runtime.ops._common import cdiv, sm_count
from clef_runtime.ops.delta_rule_common import rne_bf16, tensor_core_dots
from clef_runtime.ops.delta_rule_common import seq_bounds as _seq_bounds
from clef_runtime.ops.delta_rule_config import WalkConfig, walk_config
from clef_runtime.ops.delta_rule_plan import Recorder, plain_launch
from clef_runtime.ops.delta_rule_prepare import BT, OP, checked_inputs, prepare

# With whole-V programs one program fills an SM's registers: at ≥ 128 (sequence, value head)
# chains the unsplit walk already occupies the GPU, and splitting only adds the warm-ups' work.
UNSPLIT_PROGRAMS = 128
TARGET_PROGRAMS = 128  # below that, segments enough for this many programs (one per SM)
MIN_SEGMENT_CHUNKS = 4  # shorter segments would spend more on their warm-up than they save
MAX_SEGMENTS = 16
# A segment's warm-up ends where the log bound of the chunk maps onto its start falls below this:
# the start-state error is then at most 2⁻²⁴ (float32's unit roundoff) times the true state there.
WARMUP_LOG_BOUND = -24 * math.log(2)
WARMUP_BLOCK = 64  # chunk bounds read per step of the walk back (from the gates) ...
WARMUP_FIRST_BLOCK = 16  # ... after a first step of this many (no first step for keys' bounds)
WARMUP_BLOCK_KEYS = 4  # the same where each bound reads its chunk's keys (un-normalised keys)
# The default path takes this design for bf16 on tensor cores from this many (sequence, value
# head) chains, unsplit: measured faster there (B4 T8192, 8 packed × 4096) ...
DEFAULT_MIN_CHAINS = 128
# ... and for fewer chains whose sequences average at least this many tokens: on the H100
# (2026-12-06, graph replay) B1 T512 33.6 → 31.9 µs and T768 45.6 → 43.0 unsplit at 32-wide V
# blocks; T256 keeps the three launches (22.3 against 23.0) (bench/probe_split_threshold.py;
# docs/performance.md, "Short prompts") ...
DEFAULT_MIN_SPLIT_TOKENS = 512
# ... split into segments with warm-ups from this many: measured faster on the H200 from B1 T1024
# (62.5 → 52.3 µs by graph replay) to T131072; on the H100 B1 T512 and T768 lost with segments
# (two: 28.7 → 33.5 and 40.9 → 45.0 µs of GPU time)
MIN_SEGMENT_TOKENS = 1024


def default_segments(N: int, HV: int, V: int, tokens: int, block_v: int = 128) -> int:
    """Segments per sequence for N sequences of ``tokens`` in all (B·T; varlen: the packed T):
    one when the unsplit walk has enough programs (counted at ``block_v``-wide V blocks) or the
    sequences average fewer than MIN_SEGMENT_TOKENS tokens, else as many as keep the grid within
    TARGET_PROGRAMS (one wave of whole-V programs), none shorter than MIN_SEGMENT_CHUNKS chunks on
    average (host arithmetic only: no sync on cu_seqlens)."""
    programs = N * HV * cdiv(V, block_v)
    if programs >= UNSPLIT_PROGRAMS or tokens // max(1, N) < MIN_SEGMENT_TOKENS:
        return 1
    want = TARGET_PROGRAMS // max(1, programs)
    per_seq_chunks = cdiv(tokens, BT) // max(1, N)
    room = max(1, per_seq_chunks // MIN_SEGMENT_CHUNKS)
    return int(max(1, min(want, room, MAX_SEGMENTS)))


def walk_shape(cfg: WalkConfig, chains: int, V: int, sms: int, wide_tiles: bool) -> tuple[int, int]:
    """(V block, warps) of the walk over ``chains`` (sequence, value head, segment) chains of V
    columns on a GPU of ``sms`` SMs.  Where its tiles come by TMA with 16-bit state operands
    (``wide_tiles``, the `pipeline_stages` that take ``cfg.wide_stages``): whole-V blocks once the
    chains alone make TARGET_PROGRAMS programs, else the V block halved (down to
    ``cfg.narrow_bv``) until they do, at ``cfg.fold_warps``.  Otherwise whole-V blocks where the
    ``cfg.fold_bv``-wide grid would hold more than ``cfg.wide_per_sm`` programs per SM, else that
    grid.  On an H100 (2026-12-06, docs/performance.md "The walk at its DRAM floor") whole-V by
    TMA was faster from B1 T2048 (3%) to B4 T8192 (9%): it reads k, q, T and Aqk once a chunk and
    head, not once a V block, and its three stages keep the DRAM at 88% of its peak; at B1 T32768
    and T131072 the two shapes were within 1%.  Unsplit B1 T512 (32 chains) took 20.9 µs of walk
    at 32-wide blocks, 21.7 at 64 and 61.1 whole-V ("Short prompts")."""
    if wide_tiles:
        bv = cfg.wide_bv
        if chains >= TARGET_PROGRAMS:
            return bv, cfg.wide_warps
        while bv > cfg.narrow_bv and chains * cdiv(V, bv) < TARGET_PROGRAMS:
            bv //= 2
        return bv, cfg.fold_warps
    if chains * cdiv(V, cfg.fold_bv) > cfg.wide_per_sm * sms:
        return cfg.wide_bv, cfg.wide_warps
    return cfg.fold_bv, cfg.fold_warps


def pipeline_stages(cfg: WalkConfig, tma: bool, block_v: int, state_dt: tl.dtype) -> int:
    """The walk's pipeline stages: ``cfg.wide_stages`` for whole-V blocks whose tiles come by TMA
    and whose state dots take 16-bit operands (`wide_tiles`), else ``cfg.stages`` (f16's float32
    state operands need more shared memory than three stages leave; the masked loads were not
    timed at three)."""
    return cfg.wide_stages if wide_tiles(tma, state_dt) and block_v == cfg.wide_bv else cfg.stages


def wide_tiles(tma: bool, state_dt: tl.dtype) -> bool:
    """Whether the walk takes whole-V blocks at three stages whatever its grid: tiles by TMA and
    16-bit state operands (bf16 inputs)."""
    return tma and state_dt != tl.float32


def tma_eligible(cfg: WalkConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the walk takes its tiles by TMA: where the GPU has it (``cfg.tma``) and every row a
    descriptor addresses is 16-byte aligned: q, k and v's data, their batch and token strides and
    the head dims K and V in whole 16-byte units (the walk's own tensors are laid out so)."""
    if not cfg.tma:
        return False
    unit = 16 // q.element_size()
    return all(
        x.data_ptr() % 16 == 0
        and x.stride(0) % unit == 0
        and x.stride(1) % unit == 0
        and x.shape[3] % unit == 0
        for x in (q, k, v)
    )


def tma_factors(cfg: WalkConfig, tma: bool, N: int, tokens: int, P: int, whole_v: bool) -> bool:
    """Whether the walk of N sequences of ``tokens`` in all (B·T; varlen: the packed T) in P
    segments takes k's and w's per-token factors by TMA as well as its tiles.  It loads them only
    where that was measured faster: unsplit, in V blocks narrower than V (too few chains for a
    wave, `walk_shape`), over sequences averaging fewer than ``cfg.tma_factor_chunks`` chunks
    (host arithmetic only)."""
    short = P == 1 and not whole_v and cdiv(tokens // max(1, N), BT) < cfg.tma_factor_chunks
    return tma and not short


def takes_default_path(
    dtype: torch.dtype, tensor_cores: bool, N: int, HV: int, K: int, V: int, tokens: int = 0
) -> bool:
    """Whether `chunk_gated_delta_rule` hands a call to this design (at `default_segments`):
    bf16 on tensor cores, head dims ≤ 128 (one 128-wide tile), and either at least
    DEFAULT_MIN_CHAINS chains or N sequences of DEFAULT_MIN_SPLIT_TOKENS tokens on average
    (``tokens`` in all: B·T, or the packed T for varlen).  f16 keeps the three-launch design (its
    float32 state operands would spill at these tiles)."""
    if not (dtype == torch.bfloat16 and tensor_cores and max(K, V) <= 128):
        return False
    return N * HV >= DEFAULT_MIN_CHAINS or tokens // max(1, N) >= DEFAULT_MIN_SPLIT_TOKENS


@triton.jit
def _walk_step(
    St,
    t0,
    t_out,
    eos,
    k_p,
    t_p,
    wf_p,
    gl,
    kf_p,
    q_p,
    qf_p,
    aqk_p,
    o_p,
    ncols,
    skt,
    sqt,
    v_p,
    svt,
    k_d,
    q_d,
    v_d,
    t_d,
    a_d,
    o_d,
    bos,
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
    CHUNK_DT: tl.constexpr,
    TMA: tl.constexpr,
    TMA_FACTORS: tl.constexpr,
):
    """One chunk from its start state, held transposed (``St = Sᵀ``, V block × K); with OUTPUT,
    the chunk's output rows for these columns are stored if the chunk starts at or after t_out (a
    warm-up chunk's output is computed and dropped: one loop keeps the walk's registers as they
    were).  Returns the state at the chunk end.

    ``t_p`` holds launch 1's ``T diag(β)``, ``wf_p`` the factors e^{G} / |k| and ``v_p`` v (β is
    in T: the step loads none); ``gl`` is the chunk's decay to its end (`_chunk_end_decay`); the
    factor pointers kf_p, wf_p, qf_p are offset so that chunk t0's factors are at ``+ t0``,
    descriptors load at the chunk's row.  Every product is written as
    ``(computed tile) · (loaded tile)ᵀ``: on Hopper a wgmma takes its left operand from registers
    and its right one from shared memory, where the pipelined loads already put the tiles, so no
    computed tile (S, y, v_new) goes through shared memory on the step's dependent chain.  The
    factors scale the columns of ``Sᵀ k̂ᵀ`` after the dot instead of k's rows before it (float32
    instead of a bf16 rounding of the scaled keys).  With TMA the tiles of k, q, v, T and Aqk
    come by the sequence's tensor descriptors `*_d` (rows counted from ``bos``; rows past the
    sequence end read as zeros, as the masked loads give them) and the output leaves by ``o_d``
    (rows past the end dropped); with TMA_FACTORS the factors of k and w come by descriptors
    `kf_p`, `wf_p` too."""
    n_live = eos - t0
    r = tl.arange(0, BT)
    live = r < n_live
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    kmask = live[:, None] & (rk < K)[None, :]
    vmask_t = (rv < ncols)[:, None] & live[None, :]  # [BV, BT]
    row = (t0 - bos).to(tl.int32)  # the chunk's first row in the descriptors
    if TMA_FACTORS:  # noqa: SIM108 (kf_p and wf_p: descriptors over the sequence's factors)
        kfac = kf_p.load([row])
    else:
        kfac = tl.load(kf_p + t0 + r, mask=live, other=0.0)
    if TMA:
        kc = k_d.load([row, 0]).to(STATE_DT)
        Tc = t_d.load([row, 0]).to(CHUNK_DT)
    else:
        kc = tl.load(k_p + t0 * skt + r[:, None] * skt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
        Tc = tl.load(
            t_p + t0 * (HV * BT) + r[:, None] * (HV * BT) + r[None, :], mask=live[:, None], other=0.0
        ).to(CHUNK_DT)
    Sd = St.to(STATE_DT)
    if ROUND_BF16:
        Sd = rne_bf16(Sd)
    # yᵀ = (v - e^{G} k̂ S)ᵀ, then v_newᵀ = yᵀ (T diag(β))ᵀ
    if TMA_FACTORS:  # noqa: SIM108
        ffac = wf_p.load([row])
    else:
        ffac = tl.load(wf_p + t0 + r, mask=live, other=0.0)
    if OUTPUT:
        # unmasked: a column past the sequence end only scales an output column that is never
        # stored, and every chunk slot holds 64 factors
        qfac = tl.load(qf_p + t0 + r)
    if TMA:
        v_t = tl.trans(v_d.load([row, 0]))
    else:
        v_t = tl.load(v_p + (t0 + r)[None, :] * svt + rv[:, None], mask=vmask_t, other=0.0)
    ks = tl.dot(Sd, tl.trans(kc), input_precision=STATE_PRECISION)
    y = v_t.to(tl.float32) - ks * ffac[None, :]
    y = y.to(CHUNK_DT)
    if ROUND_BF16:
        y = rne_bf16(y)
    v_new = tl.dot(y, tl.trans(Tc), input_precision="ieee")  # [BV, BT]
    vk = (v_new * kfac[None, :]).to(STATE_DT)
    if ROUND_BF16:
        vk = rne_bf16(vk)
    if OUTPUT:
        vd = v_new.to(STATE_DT)
        if ROUND_BF16:
            vd = rne_bf16(vd)
        if TMA:
            qc = q_d.load([row, 0]).to(STATE_DT)
            Ac = a_d.load([row, 0])
        else:
            qc = tl.load(q_p + t0 * sqt + r[:, None] * sqt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
            # launch 1 stored Aqk's whole rows, zero above the diagonal: a mask by rows only lets the
            # load be pipelined (a per-element mask cannot be an asynchronous copy)
            Ac = tl.load(
                aqk_p + t0 * (HV * BT) + r[:, None] * (HV * BT) + r[None, :], mask=live[:, None], other=0.0
            )
        oc = tl.dot(Sd, tl.trans(qc), input_precision=STATE_PRECISION) * qfac[None, :] + tl.dot(
            vd, tl.trans(Ac.to(STATE_DT)), input_precision=STATE_PRECISION
        )  # oᵀ, [BV, BT]
        if ROUND_BF16:
            oc = rne_bf16(oc)
        if TMA:  # cannot be masked: `_walk` runs the warm-up chunks without OUTPUT
            o_d.store([row, 0], tl.trans(oc).to(o_p.dtype.element_ty))
        else:
            tl.store(
                o_p + t0 * (HV * V) + r[None, :] * (HV * V) + rv[:, None],
                oc.to(o_p.dtype.element_ty),
                mask=vmask_t & (t0 >= t_out),
            )
    return St * tl.exp(gl) + tl.dot(vk, kc, input_precision=STATE_PRECISION)


@triton.jit
def _chunk_end_decay(gc_p, t0, t_hi, eos, BT: tl.constexpr):
    """The decay from the chunk at t0 to its end, ``G`` at its last token (``gc_p`` indexed by
    token); 0 for a chunk at or past t_hi (the step after a span's last reads nothing)."""
    return tl.load(gc_p + t0 + tl.minimum(eos - t0, BT) - 1, mask=t0 < t_hi, other=0.0)


# fmt: off
@triton.jit
def _walk_span(
    S, t_lo, t_out, t_hi, eos, k_p, t_p, wf_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, skt, sqt,
    v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    OUTPUT: tl.constexpr, STATE_DT: tl.constexpr, STATE_PRECISION: tl.constexpr, ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr, CHUNK_DT: tl.constexpr, TMA: tl.constexpr, TMA_FACTORS: tl.constexpr,
):
    """`_walk_step` over the chunks of tokens [t_lo, t_hi) from state S, outputs from t_out on;
    returns the state at t_hi.  Each chunk's decay to its end (one float a chunk, ``gc_p``) is
    loaded a step ahead: a scalar load is not pipelined, and loaded at its own step it stalled
    the state's update (sm_90 profile: 4-11% of the walk's stall samples)."""
    gl = _chunk_end_decay(gc_p, t_lo, t_hi, eos, BT)
    if INTERPRETED:  # Triton 3.6's interpreter cannot take a runtime range bound (numpy ≥ 2)
        t0 = t_lo
        while t0 < t_hi:
            gl_next = _chunk_end_decay(gc_p, t0 + BT, t_hi, eos, BT)
            S = _walk_step(
                S, t0, t_out, eos, k_p, t_p, wf_p, gl, kf_p, q_p, qf_p, aqk_p, o_p, ncols, skt, sqt,
                v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
                HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16, CHUNK_DT, TMA, TMA_FACTORS,
            )
            gl = gl_next
            t0 += BT
    else:
        # a for loop, so the compiler can pipeline the next chunk's loads behind this one's dots
        for c in range(0, tl.cdiv(t_hi - t_lo, BT)):
            t0 = t_lo + c * BT
            gl_next = _chunk_end_decay(gc_p, t0 + BT, t_hi, eos, BT)
            S = _walk_step(
                S, t0, t_out, eos, k_p, t_p, wf_p, gl, kf_p, q_p, qf_p, aqk_p, o_p, ncols,
                skt, sqt, v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
                HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16, CHUNK_DT, TMA, TMA_FACTORS,
            )
            gl = gl_next
    return S


@triton.jit
def _walk(
    S, t_lo, t_out, t_hi, eos, k_p, t_p, wf_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, skt, sqt,
    v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    OUTPUT: tl.constexpr, STATE_DT: tl.constexpr, STATE_PRECISION: tl.constexpr, ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr, CHUNK_DT: tl.constexpr, TMA: tl.constexpr, TMA_FACTORS: tl.constexpr,
):
    """`_walk_span` over the chunks of tokens [t_lo, t_hi) from state S, outputs from t_out on;
    returns the state at t_hi.  Both launches walk through here (inlined on a GPU).  A TMA store
    cannot be masked, so with TMA the warm-up chunks [t_lo, t_out) go first, without an output."""
    t_first = t_lo
    if TMA:
        S = _walk_span(
            S, t_lo, t_out, t_out, eos, k_p, t_p, wf_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, skt, sqt,
            v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
            HV, K, V, BK, BV, BT, False, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED, CHUNK_DT, TMA, TMA_FACTORS,
        )
        t_first = t_out
    return _walk_span(
        S, t_first, t_out, t_hi, eos, k_p, t_p, wf_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, skt, sqt,
        v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
        HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED, CHUNK_DT, TMA, TMA_FACTORS,
    )
# fmt: on


@triton.jit(do_not_specialize=["T", "P", "NS"])
def _segment_output_kernel(
    q,
    k,
    v,
    tinv,
    wf,
    gc,
    kf,
    qf,
    aqk,
    o,
    cw,
    h0,
    ht,
    cu_seqlens,
    T,
    P,
    NS,
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
    BT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    STATE_DT: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    WARMUP: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr,
    CHUNK_DT: tl.constexpr,
    TMA: tl.constexpr,
    TMA_FACTORS: tl.constexpr,
):
    """Segment s of one sequence, value head and V block: its start state from a warm-up walk
    over the chunks before it, then its chunks with the output fused.  ``tinv`` holds launch 1's
    ``T diag(β)`` per chunk and ``wf`` the factors e^{G} / |k| of k's rows, from which each step
    forms w and u.  With TMA the walk moves its tiles (and with TMA_FACTORS two of its per-token
    factors) by tensor descriptors of this sequence's rows (`tma_eligible`, `tma_factors`)."""
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
    # the state's block held transposed, [BV, BK] (`_walk_step`)
    s_off = rv[:, None] + rk[None, :] * V
    s_mask = (rv < ncols)[:, None] & (rk < K)[None, :]
    h0 += i_nh * K * V + c0
    ht += i_nh * K * V + c0
    seg = tl.cdiv(tl.cdiv(eos - bos, BT), P)  # chunks per segment
    t_lo = tl.minimum(bos + s * seg * BT, eos)
    t_hi = tl.minimum(bos + (s + 1) * seg * BT, eos)
    t_w = bos  # where the walk starts: from the initial state at the sequence start, or ...
    if WARMUP:  # ... from zero at the first chunk whose map onto t_lo is below the bound
        c_w = tl.load(cw + i_nh * P + s).to(tl.int64)  # `warmup_start`, from launch 1
        t_w = tl.where(c_w < 0, bos, bos + c_w * BT)
        from_start = c_w < 0
    else:
        from_start = s == s
    if HAS_H0:
        S = tl.load(h0 + s_off, mask=s_mask & from_start, other=0.0)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)

    k_p = k + b * skb + h * K
    q_p = q + b * sqb + h * K
    tok = b * T * HV + hv
    hd = (b * HV + hv) * T
    # the sequence's per-token factors by chunk slot (launch 1's [B, HV, NS, BT]), offset so that
    # token t0's chunk is at `+ t0` as in the token-indexed tensors
    slot0 = bos // BT + n if IS_VARLEN else n * 0  # its first slot in the batch row
    fd = ((b * HV + hv) * NS + slot0) * BT
    t_p = tinv + tok * BT
    wf_p = wf + fd - bos
    o_p = o + tok * V + c0
    aqk_p = aqk + tok * BT
    v_p = v + b * svb + hv * V + c0
    if TMA:
        # one descriptor per tile source, over this sequence's rows [bos, eos) and this program's
        # columns: rows (and V columns) past the end read as zeros and are not written
        nrow = (eos - bos).to(tl.int32)
        k_d = tl.make_tensor_descriptor(k_p + bos * skt, [nrow, K], [skt, 1], [BT, BK])
        q_d = tl.make_tensor_descriptor(q_p + bos * sqt, [nrow, K], [sqt, 1], [BT, BK])
        v_d = tl.make_tensor_descriptor(v_p + bos * svt, [nrow, ncols], [svt, 1], [BT, BV])
        t_d = tl.make_tensor_descriptor(t_p + bos * (HV * BT), [nrow, BT], [HV * BT, 1], [BT, BT])
        a_d = tl.make_tensor_descriptor(aqk_p + bos * (HV * BT), [nrow, BT], [HV * BT, 1], [BT, BT])
        o_d = tl.make_tensor_descriptor(o_p + bos * (HV * V), [nrow, ncols], [HV * V, 1], [BT, BV])
    else:
        k_d = k_p  # unused
        q_d = k_p
        v_d = k_p
        t_d = k_p
        a_d = k_p
        o_d = k_p
    kf_h = kf + fd - bos
    qf_h = qf + fd - bos
    if TMA_FACTORS:
        # k's and w's per-token factors by TMA too, through 1-D descriptors over the sequence's
        # [eos - bos) (each chunk's 64 start 256-byte aligned, launch 1's slots); past the end
        # they read zeros, as the masked loads give them.  q's factor never does: it scales a
        # dot's result rather than feeding an operand, so its copy is not pipelined (measured
        # 4-10% slower).
        nfac = (eos - bos).to(tl.int32)
        kf_h = tl.make_tensor_descriptor(kf + fd, [nfac], [1], [BT])
        wf_p = tl.make_tensor_descriptor(wf + fd, [nfac], [1], [BT])
    # the warm-up chunks [t_w, t_lo) (their outputs dropped), then the segment's own
    S = _walk(
        S, t_w, t_lo, t_hi, eos, k_p, t_p, wf_p, gc + hd, kf_h, q_p, qf_h, aqk_p, o_p,
        ncols, skt, sqt, v_p, svt, k_d, q_d, v_d, t_d, a_d, o_d, bos,
        HV, K, V, BK, BV, BT, True, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED, CHUNK_DT, TMA, TMA_FACTORS,
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
    block_v: int | None = None,
    warps: int | None = None,
    stages: int | None = None,
    config: WalkConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked delta rule in the split design (same contract as
    `clef_runtime.ops.delta_rule_chunk.chunk_gated_delta_rule`).  ``segments``: per sequence
    (None: `default_segments`); ``block_v``, ``warps``, ``stages``: the walk's column block, warps
    and pipeline stages (for measurements; None: `walk_shape` and `pipeline_stages`); ``config``:
    the walk's configuration (None: the device's, `delta_rule_config.walk_config`).  Raises
    ValueError where the device takes the FMA configuration (float32, sm70): that path has the
    three-launch design only."""
    _, T, H, HV, K, V, N, scale = checked_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    if not tensor_core_dots(q.dtype, q.device):
        raise ValueError(f"{OP}: the split design runs on tensor cores only (16-bit inputs, sm80+)")
    return run_split(
        q, k, v, g, beta, (T, H, HV, K, V, N), scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm,
        segments, block_v, warps, stages, config=config,
    )  # fmt: skip


def run_split(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    dims: tuple[int, int, int, int, int, int],
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm: bool,
    segments: int | None = None,
    block_v: int | None = None,
    warps: int | None = None,
    stages: int | None = None,
    rec: Recorder | None = None,
    config: WalkConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunk_gated_delta_rule_split` on inputs already checked (`checked_inputs`: ``dims`` is its
    (T, H, HV, K, V, N), ``scale`` its scale) and on tensor cores: what
    `delta_rule_chunk.chunk_gated_delta_rule` hands over, so that a call checks its inputs once
    (the checks cost tens of µs of host time a call); ``rec`` records its launches for a plan
    (`delta_rule_plan`)."""
    T, H, HV, K, V, N = dims
    P = default_segments(N, HV, V, q.shape[0] * T) if segments is None else int(segments)
    if P < 1:
        raise ValueError(f"{OP}: segments must be ≥ 1, got {P}")
    wcfg = walk_config(q.device) if config is None else config
    tma = T > 0 and tma_eligible(wcfg, q, k, v)
    # launch 1's first N·HV·P programs find the segments' warm-up starts (two launches a call:
    # docs/performance.md, "Host time per chunked call"); unsplit calls (P = 1) keep launch 1
    # without those programs
    P_warm = P > 1
    blocks = (WARMUP_BLOCK, WARMUP_FIRST_BLOCK) if use_qk_l2norm else (WARMUP_BLOCK_KEYS, 0)
    p = prepare(
        q, k, v, g, beta, N, scale, cu_seqlens, use_qk_l2norm, output_final_state, True, True,
        extra=(((N * HV * P,), torch.int32) if P_warm else None,), rec=rec,
        warmup_plan=(P, WARMUP_LOG_BOUND, *blocks) if P_warm else None,
    )  # fmt: skip
    policy, cfg = p.policy, p.cfg
    walk_bv, walk_warps = walk_shape(
        wcfg, N * HV * P, V, sm_count(q.device), wide_tiles(tma, policy.state_dtype)
    )
    BV = min(block_v or walk_bv, cfg.BVF)
    varlen = cu_seqlens is not None
    cw = p.gc  # an unused pointer with one segment
    if P_warm:
        assert p.extra[0] is not None
        cw = p.extra[0]
    walk_stages = pipeline_stages(wcfg, tma, BV, policy.state_dtype)
    # the descriptors need global scratch memory from Triton's allocator: ours for this launch,
    # unless the caller has set one (`delta_rule_plan.launch_with_scratch`)
    plain_launch(
        rec, _segment_output_kernel, (N * HV, cdiv(V, BV), P),
        (
            q, k, v, p.w, p.u, p.gc, p.kf, p.qf, p.aqk, p.o, cw,
            initial_state if initial_state is not None else p.gc,
            p.final if p.final is not None else p.gc,
            p.cu, T, P, p.NS, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        ),
        dict(
            H=H, HV=HV, K=K, V=V, BK=cfg.BK, BV=BV, BT=BT, IS_VARLEN=varlen,
            HAS_H0=initial_state is not None, STORE_FINAL=p.final is not None,
            STATE_DT=policy.state_dtype, STATE_PRECISION=policy.state_precision, WARMUP=P_warm,
            ROUND_BF16=policy.round_bf16, INTERPRETED=interpreted(_segment_output_kernel),
            CHUNK_DT=policy.chunk_dtype, TMA=tma, TMA_FACTORS=tma_factors(wcfg, tma, N, q.shape[0] * T, P, BV >= V),
            num_warps=warps or walk_warps, num_stages=stages or walk_stages,
        ),
        scratch=q.device if tma else None,
    )  # fmt: skip
    return p.o, p.final
