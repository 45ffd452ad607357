"""Chunked gated delta rule with the output fused into the recurrence and the sequence split
across programs ("split" design; the default path for bf16 with many chains or long sequences:
`delta_rule_chunk_split.takes_default_path`, docs/performance.md).

Launch 1 is the three-launch design's `_chunk_prepare_kernel` (w, u, Aqk and the per-token
factors; `clef_runtime.ops.delta_rule_chunk` has the algebra).  What differs is the rest: the
chunk states are never stored.  A program walks its chunks with the float32 state in registers
and writes each chunk's output as it goes (``o = qf ⊙ (q S_c) + Aqk v_new``), so the 537 MB of
chunk states and the v_new round trip of the three-launch design (B1 T32768 bf16) are gone.

Walking a whole sequence in one program leaves too few programs at B1 (32 value heads × V
blocks) and a long chain, so each sequence can be cut into ``P`` segments of whole chunks, one
program each (launch 3, `_segment_output_kernel`, grid ``(N·HV, V / BV, P)``; where each
segment's warm-up starts is found by launch 1's first programs for L2-normalised keys, by launch
2, `_warmup_plan_kernel`, otherwise).  A segment needs
its true start state; it gets it from a *warm-up walk* over the chunks before it.  Each token
maps the state by ``S ← e^{g} (I - β k̂ k̂ᵀ) S + …``, whose linear part has spectral norm
``e^{g} max(1, |1 - β |k̂|²|)``, so the map of chunks ``c_w .. c_lo - 1`` onto the segment start
has norm at most ``e^{Σ b_c}`` with ``b_c`` the chunk's sum of ``g + log max(1, |1 - β |k̂|²|)``
(with L2-normalised keys ``|k̂|² ≤ 1``, so the gates alone give it: ``max(1, |1 - β|)``;
otherwise launch 1 stores it per chunk and value head: ``chunk_bound``).  A segment starting at
chunk ``c_lo`` walks back until that sum falls below ``WARMUP_LOG_BOUND = ln 2⁻²⁴``, walks those
chunks from a zero state without writing outputs, then its own chunks with the output.  Starting
from zero instead of the true state there leaves an error of at most ``2⁻²⁴`` times that state's
norm: float32 rounding.  If the sum never falls that low (a head with no decay, or keys whose
``β |k̂|²`` exceeds 2), the warm-up reaches the sequence start and begins from the initial state:
the exact walk, only longer.  So the split is never wrong, only slower when a head barely
decays.  (An earlier form joined the segments by their affine maps ``S_end = M_s S + L_s``, K×K
``M_s``; the maps cost as much as the walk itself: docs/performance.md, "fourth pass".)

Launch 1 stores each chunk's ``T = (I + A)⁻¹`` and the factors ``β e^{G} / |k|`` in place of w
and u, and each walk step takes ``v_new = u - w S = T (β v - (β e^{G} k̂) S)``: w and u are never
formed (``FORM_WU``; launch 1 loses its w/u pass, the walk one 64 × 64 × V dot more), at 64-wide V
blocks and 4 warps (whole-V blocks at 8 warps for grids of more than two programs per SM:
`walk_shape`), split into segments or not.  The walk holds its state block transposed (``Sᵀ``,
`_split_step_vk`) so that every dot is (a tile computed in registers) · (a tile loaded from
memory)ᵀ: on Hopper that is a wgmma with its left operand in registers and its right one in the
shared memory the pipelined loads fill, and no computed tile is copied to shared memory on the
step's chain (docs/performance.md, "ninth pass").  On sm_90 those tiles arrive, and the output
leaves, by TMA (``TMA_TILES``): each program makes tensor descriptors over its sequence's rows,
so rows past the sequence end read as zeros and are not written, as with masked loads and
stores, without their per-thread address and mask arithmetic ("tenth pass").

The segments differ from a single walk only in rounding.  With ``P = 1`` there is no warm-up
and the kernel is the plain fused recurrence.  Segments hold ``ceil(chunks / P)`` chunks of their
sequence (varlen: per sequence); the last segment's program stores the final state (an empty
last segment warms up to the sequence end and stores it).

Tensor-core configuration only: the FMA path (float32, the V100's f16) keeps the three-launch
design, whose FMA tiles were sized for sm70's registers.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from clef_runtime.interpreter import interpreted
from clef_runtime.ops._common import cdiv
from clef_runtime.ops.delta_rule_common import (
    capability,
    rne_bf16,
    tensor_core_dots,
    warmup_start,
)
from clef_runtime.ops.delta_rule_common import seq_bounds as _seq_bounds
from clef_runtime.ops.delta_rule_plan import Recorder, plain_launch
from clef_runtime.ops.delta_rule_prepare import BT, OP, checked_inputs, prepare

# With FORM_WU off, launches 2 and 3 take the whole V = 128 per program (k, w, q and Aqk are then
# read once per chunk and value head, not once per V block), 8 warps, 2 stages (3 need 254 KB of
# shared memory).
# Measured on the H200 (docs/performance.md, "Split design"): 32-wide blocks at 4 warps were
# 1.3-1.6× slower, 64-wide at 8 warps in between.
SPLIT_BV = 128
SPLIT_WARPS = 8
SPLIT_STAGES = 2
# With whole-V programs one program fills an SM's registers: at ≥ 128 (sequence, value head)
# chains the unsplit walk already occupies the GPU, and splitting only adds the maps' work.
UNSPLIT_PROGRAMS = 128
TARGET_PROGRAMS = 128  # below that, segments enough for this many programs (one per SM)
MIN_SEGMENT_CHUNKS = 4  # shorter segments would spend more on their warm-up than they save
MAX_SEGMENTS = 16
# A segment's warm-up ends where the log bound of the chunk maps onto its start falls below this:
# the start-state error is then at most 2⁻²⁴ (float32's unit roundoff) times the true state there.
WARMUP_LOG_BOUND = -24 * math.log(2)
WARMUP_BLOCK = 64  # chunk bounds read per step of the walk back
# The default path takes this design for bf16 on tensor cores from this many (sequence, value
# head) chains, unsplit: measured faster there (B4 T8192, 8 packed × 4096) ...
DEFAULT_MIN_CHAINS = 128
# ... and, split into segments with warm-ups, for fewer chains whose sequences average at least
# this many tokens: with the fold measured faster from B1 T2048 (1.19× at the bench's gates, 1.12×
# at the model's) to T131072 (docs/performance.md, "sixth" to "eighth pass"); B1 T512 keeps the
# three launches (it meets its target there).
DEFAULT_MIN_SPLIT_TOKENS = 2048
# Launch 1 stores each chunk's T (64 × 64) instead of w and u (64 × 128 each) and the walk takes
# v_new = T (β v - β e^{G} k̂ S) per step, at 64-wide V blocks and 4 warps (whole-V programs spill
# 176 bytes with it): on the H200 B1 T8192 and T32768 9-12% faster split into segments
# (docs/performance.md, "seventh pass"), B4 T8192 and 8 packed × 4096 8-10% faster unsplit
# ("eighth pass"; there whole-V walks folded were 7% slower than stored, 32-wide 14%).
FORM_WU = True
FOLD_BV = 64
FOLD_WARPS = 4
# ... unless the grid at FOLD_BV has more programs than WIDE_PER_SM per SM (two fit an SM's
# registers): then whole-V programs at 8 warps, which read k, q, T and Aqk once per chunk and
# value head instead of once per V block (`walk_shape`; None: never).
WIDE_BV = 128
WIDE_WARPS = 8
WIDE_PER_SM: int | None = 2
# The whole-V walk with its tiles by TMA (one program per SM) takes three pipeline stages (its k,
# q, v, T and Aqk tiles are 64 KB a stage): on the H200, 8 packed × 4096 went 819.7 → 784.1 µs
# (docs/performance.md, "eleventh pass").  The 64-wide walk keeps SPLIT_STAGES (two programs per
# SM must fit in its shared memory), and so do the masked loads (not timed at three) and f16
# (`pipeline_stages`).
WIDE_STAGES = 3
# The folded walk moves its k, q, v, T and Aqk tiles and its output by TMA, through tensor
# descriptors that each program makes for its sequence's rows (`tma_eligible`): on the H200 the
# walk went 633 → 445 µs at B1 T32768, the whole call 1.20-1.24× faster at B1 T8192, B1 T32768 and
# B4 T8192, with the same outputs to the bit (docs/performance.md, "tenth pass").  Its per-thread
# copies' address and mask arithmetic (~540 instructions of a 1328-instruction step) and the
# output's layout change go away, and so do its register spills.
TMA_TILES = True
# ... and two of its per-token factors (k's and β e^{G} / |k|, 64 floats each a step), which
# otherwise take per-thread asynchronous copies with their address and mask arithmetic: the
# sm_90 walk's loops 913 → 889 (output) and 687 → 633 (warm-up) instructions; on the H200 B1
# T131072 3052.6 → 2991.1 µs, B1 T32768 775.5 → 762.9, bit-identical (docs/performance.md,
# "eleventh pass").  q's factor as well would need 88 bytes of shared memory more than two walks
# per SM have (with BETA_IN_T it fits, and was 6% slower: twelfth pass).  A descriptor's row
# and a load's first element must start 16-byte aligned: launch 1 stores the factors by chunk
# slot (each chunk's 64 at a multiple of 64 floats), so packed sequences take them too.
TMA_FACTORS = True
# Launch 1 stores β by chunk slot as well, so that a walk step whose tiles come by TMA reads its
# chunk's 64 β contiguous (or by TMA) rather than with the input's stride of HV floats.
BETA_ROWS = True
# The whole-V walk (one program per SM, shared memory to spare) takes β by TMA too; the 64-wide
# walk would need 344 bytes more shared memory than two programs per SM have.  (q's factor by TMA
# is not pipelined, as it scales a dot's result rather than feeding an operand: the copy and its
# wait land inside the step, twelfth pass's "q's factor by TMA", 4-10% slower.)
TMA_WIDE_FACTORS = True
# The walk launched with programmatic dependent launch (sm_90): its programs may start while the
# kernel before it (launch 1, or launch 2 with segments) finishes, and wait for its results
# (`griddepcontrol.wait`) only before reading them; launch 1 signals its dependants as it starts.
# That hides the launch gap and launch 1's last, partly filled wave.  Off: bit-identical, and on
# the H200 0.5-1% faster on unsplit rows (B4 T8192 1.031x, then 1.012x on a repeat), no faster on
# split ones, inside the probe's noise (docs/performance.md, "fourteenth pass").
PDL = False
# Launch 1 stores T diag(β) and e^{G} / |k| for the fold (β folded into T), so that the walk's
# steps need not load β (a strided per-thread load of 64 floats a step).  Off: on the H200 the
# walk gains what launch 1 loses (B1 T32768: walk 417.9 → 382.6 µs, launch 1 356.9 → 374.8,
# the call 762.8 → 762.1; B4 T8192 0.995×, B1 T131072 1.011×, packed 8 × 4096 0.994×:
# docs/performance.md, "twelfth pass").
BETA_IN_T = False


def default_segments(N: int, HV: int, V: int, T: int, block_v: int = SPLIT_BV) -> int:
    """Segments per sequence: one when the unsplit walk has enough programs, else enough for
    TARGET_PROGRAMS, none shorter than MIN_SEGMENT_CHUNKS chunks on average (host arithmetic
    only: no sync on cu_seqlens)."""
    programs = N * HV * cdiv(V, block_v)
    if programs >= UNSPLIT_PROGRAMS:
        return 1
    want = cdiv(TARGET_PROGRAMS, max(1, programs))
    per_seq_chunks = cdiv(T, BT) // max(1, N)
    room = max(1, per_seq_chunks // MIN_SEGMENT_CHUNKS)
    return int(max(1, min(want, room, MAX_SEGMENTS)))


def walk_shape(programs: int, sms: int) -> tuple[int, int]:
    """(V block, warps) of the folded walk, whose grid has ``programs`` programs at FOLD_BV on a
    GPU of ``sms`` SMs: FOLD_BV and FOLD_WARPS, or WIDE_BV and WIDE_WARPS where that grid would
    hold more than WIDE_PER_SM programs per SM."""
    if WIDE_PER_SM is not None and programs > WIDE_PER_SM * sms:
        return WIDE_BV, WIDE_WARPS
    return FOLD_BV, FOLD_WARPS


def pipeline_stages(tma: bool, block_v: int, state_dt: tl.dtype) -> int:
    """The folded walk's pipeline stages: WIDE_STAGES for whole-V blocks whose tiles come by TMA
    and whose state dots take 16-bit operands (bf16: where three were measured faster), else
    SPLIT_STAGES (f16's float32 state operands need more shared memory than three stages leave)."""
    return WIDE_STAGES if tma and block_v == WIDE_BV and state_dt != tl.float32 else SPLIT_STAGES


def tma_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the walk can take its tiles by TMA (TMA_TILES): a GPU of compute capability 9 or
    more (the interpreter stands in for one on the CPU), and every row a descriptor addresses 16-byte
    aligned: q, k and v's data, their batch and token strides and the head dims K and V in whole
    16-byte units (the walk's own tensors are laid out so)."""
    if not TMA_TILES:
        return False
    if q.device.type == "cuda" and capability(q.device)[0] < 9:
        return False
    unit = 16 // q.element_size()
    return all(
        x.data_ptr() % 16 == 0
        and x.stride(0) % unit == 0
        and x.stride(1) % unit == 0
        and x.shape[3] % unit == 0
        for x in (q, k, v)
    )


def factor_descriptors(tma: bool, block_v: int, beta_rows: bool) -> int:
    """Which of the walk's per-token factors come by TMA: 0 (none: the tiles come by per-thread
    copies, or TMA_FACTORS is off), 1 (k's and β e^{G} / |k|), 2 (also β, for the whole-V walk
    where TMA_WIDE_FACTORS is set and launch 1 stored β by chunk slot)."""
    if not (tma and TMA_FACTORS):
        return 0
    return 2 if TMA_WIDE_FACTORS and beta_rows and block_v == WIDE_BV else 1


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    """The device's SM count (1 off a CUDA device: the interpreter runs one program at a time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def takes_default_path(
    dtype: torch.dtype, tensor_cores: bool, N: int, HV: int, K: int, V: int, T: int = 0
) -> bool:
    """Whether `chunk_gated_delta_rule` hands a call to this design (at `default_segments`):
    bf16 on tensor cores, head dims ≤ 128 (one 128-wide tile), and either at least
    DEFAULT_MIN_CHAINS chains or sequences of DEFAULT_MIN_SPLIT_TOKENS tokens on average (T is
    the padded total for varlen).  f16 keeps the three-launch design (its float32 state operands
    would spill at these tiles)."""
    if not (dtype == torch.bfloat16 and tensor_cores and max(K, V) <= 128):
        return False
    return N * HV >= DEFAULT_MIN_CHAINS or T // max(1, N) >= DEFAULT_MIN_SPLIT_TOKENS


@triton.jit
def _split_step(
    S,
    t0,
    t_out,
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
    """One chunk from its start state S (K × the columns of one block) with w and u stored by
    launch 1 (FORM_WU off); with OUTPUT, the chunk's output rows for these columns are stored if
    the chunk starts at or after t_out (a warm-up chunk's output is computed and dropped: one loop
    keeps the walk's registers as they were).  Returns the state at the chunk end."""
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
    Sd = S.to(STATE_DT)
    if ROUND_BF16:
        Sd = rne_bf16(Sd)
    wc = tl.load(w_p + t0 * (HV * K) + r[:, None] * (HV * K) + rk[None, :], mask=kmask, other=0.0).to(
        STATE_DT
    )
    uc = tl.load(u_p + t0 * (HV * V) + r[:, None] * (HV * V) + rv[None, :], mask=vmask & use_u, other=0.0).to(
        tl.float32
    )
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
        a_mask = live[:, None] & (r[None, :] <= r[:, None])  # the causal part
        Ac = tl.load(aqk_p + t0 * (HV * BT) + r[:, None] * (HV * BT) + r[None, :], mask=a_mask, other=0.0)
        oc = qfac[:, None] * tl.dot(qc, Sd, input_precision=STATE_PRECISION) + tl.dot(
            Ac.to(STATE_DT), vd, input_precision=STATE_PRECISION
        )
        if ROUND_BF16:
            oc = rne_bf16(oc)
        tl.store(
            o_p + t0 * (HV * V) + r[:, None] * (HV * V) + rv[None, :],
            oc.to(o_p.dtype.element_ty),
            mask=vmask & (t0 >= t_out),
        )
    return S * tl.exp(gl) + tl.dot(tl.trans(kc), vk, input_precision=STATE_PRECISION)


@triton.jit
def _split_step_vk(
    St,
    t0,
    t_out,
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
    v_p,
    svt,
    b_p,
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
    BETA_IN_T: tl.constexpr,
    BETA_ROWS: tl.constexpr,
):
    """One chunk as `_split_step` does it, with the fold (FORM_WU: w_p holds launch 1's T, u_p the
    factors β e^{G} / |k|, v_p at v and b_p at β: launch 1's by chunk slot with BETA_ROWS (a
    descriptor with TMA_FACTORS > 1), else the input's, stride HV; with BETA_IN_T T diag(β) and
    e^{G} / |k|, and b_p is not read; the factor pointers kf_p, u_p, qf_p are offset so that
    chunk t0's factors are at ``+ t0``, descriptors load at the chunk's row), the state held transposed (``St = Sᵀ``,
    V block × K) and every product written as ``(computed tile) · (loaded tile)ᵀ``: the left
    operand of each dot is formed in registers and the right one is a tile read from memory.  On
    Hopper a wgmma takes its left operand from registers and its right one from shared memory,
    where the pipelined loads already put the tiles; so no computed tile (S, y, v_new) goes
    through shared memory on the step's dependent chain.  The factors scale the columns of
    ``Sᵀ k̂ᵀ`` after the dot instead of k's rows before it (float32 instead of a bf16 rounding of
    the scaled keys).  With TMA the tiles of k, q, v, T and Aqk come by the sequence's tensor
    descriptors `*_d` (rows counted from ``bos``; rows past the sequence end read as zeros, as
    the masked loads give them) and the output leaves by ``o_d`` (rows past the end dropped)."""
    n_live = eos - t0
    r = tl.arange(0, BT)
    live = r < n_live
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    kmask = live[:, None] & (rk < K)[None, :]
    vmask_t = (rv < ncols)[:, None] & live[None, :]  # [BV, BT]
    gl = tl.load(gc_p + t0 + tl.minimum(n_live, BT) - 1)  # decay to the chunk end
    row = (t0 - bos).to(tl.int32)  # the chunk's first row in the descriptors
    if TMA_FACTORS > 0:  # noqa: SIM108 (kf_p and u_p: descriptors over the sequence's factors)
        kfac = kf_p.load([row])
    else:
        kfac = tl.load(kf_p + t0 + r, mask=live, other=0.0)
    if TMA:
        kc = k_d.load([row, 0]).to(STATE_DT)
        Tc = t_d.load([row, 0]).to(CHUNK_DT)
    else:
        kc = tl.load(k_p + t0 * skt + r[:, None] * skt + rk[None, :], mask=kmask, other=0.0).to(STATE_DT)
        Tc = tl.load(
            w_p + t0 * (HV * BT) + r[:, None] * (HV * BT) + r[None, :], mask=live[:, None], other=0.0
        ).to(CHUNK_DT)
    Sd = St.to(STATE_DT)
    if ROUND_BF16:
        Sd = rne_bf16(Sd)
    # yᵀ = (β v - β e^{G} k̂ S)ᵀ, then v_newᵀ = yᵀ Tᵀ
    if TMA_FACTORS > 0:  # noqa: SIM108
        bfac = u_p.load([row])
    else:
        bfac = tl.load(u_p + t0 + r, mask=live, other=0.0)
    if not BETA_IN_T:
        if TMA_FACTORS > 1:  # β by chunk slot (BETA_ROWS), by a descriptor
            bvv = b_p.load([row])
        elif BETA_ROWS:  # β by chunk slot, contiguous
            bvv = tl.load(b_p + t0 + r, mask=live, other=0.0)
        else:  # the input's β, stride HV
            bvv = tl.load(b_p + (t0 + r) * HV, mask=live, other=0.0)
    if OUTPUT:  # (by TMA it would not be pipelined: it scales a dot's result, not an operand)
        qfac = tl.load(qf_p + t0 + r, mask=live, other=0.0)
    if TMA:
        v_t = tl.trans(v_d.load([row, 0]))
    else:
        v_t = tl.load(v_p + (t0 + r)[None, :] * svt + rv[:, None], mask=vmask_t & use_u, other=0.0)
    ks = tl.dot(Sd, tl.trans(kc), input_precision=STATE_PRECISION)
    if BETA_IN_T:  # launch 1 stored T diag(β) and e^{G} / |k|: v_newᵀ = (v - e^{G} k̂ S)ᵀ (T diag(β))ᵀ
        y = v_t.to(tl.float32) - ks * bfac[None, :]
    else:
        y = v_t.to(tl.float32) * bvv[None, :] - ks * bfac[None, :]
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


# fmt: off
@triton.jit
def _walk_span(
    S, t_lo, t_out, t_hi, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
    v_p, svt, b_p, k_d, q_d, v_d, t_d, a_d, o_d, bos,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    OUTPUT: tl.constexpr, STATE_DT: tl.constexpr, STATE_PRECISION: tl.constexpr, ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr, FORM_WU: tl.constexpr, CHUNK_DT: tl.constexpr, TMA: tl.constexpr,
    TMA_FACTORS: tl.constexpr, BETA_IN_T: tl.constexpr, BETA_ROWS: tl.constexpr,
):
    """`_split_step` (`_split_step_vk` with FORM_WU) over the chunks of tokens [t_lo, t_hi) from
    state S, outputs from t_out on; returns the state at t_hi."""
    if INTERPRETED:  # Triton 3.6's interpreter cannot take a runtime range bound (numpy ≥ 2)
        t0 = t_lo
        while t0 < t_hi:
            if FORM_WU:
                S = _split_step_vk(
                    S, t0, t_out, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
                    v_p, svt, b_p, k_d, q_d, v_d, t_d, a_d, o_d, bos,
                    HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16, CHUNK_DT, TMA, TMA_FACTORS, BETA_IN_T, BETA_ROWS,
                )  # fmt: skip
            else:
                S = _split_step(
                    S, t0, t_out, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
                    HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16,
                )  # fmt: skip
            t0 += BT
    else:
        # a for loop, so the compiler can pipeline the next chunk's loads behind this one's dots
        for c in range(0, tl.cdiv(t_hi - t_lo, BT)):
            if FORM_WU:
                S = _split_step_vk(
                    S, t_lo + c * BT, t_out, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u,
                    skt, sqt, v_p, svt, b_p, k_d, q_d, v_d, t_d, a_d, o_d, bos,
                    HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16, CHUNK_DT, TMA, TMA_FACTORS, BETA_IN_T, BETA_ROWS,
                )  # fmt: skip
            else:
                S = _split_step(
                    S, t_lo + c * BT, t_out, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u,
                    skt, sqt, HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16,
                )  # fmt: skip
    return S


@triton.jit
def _walk(
    S, t_lo, t_out, t_hi, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
    v_p, svt, b_p, k_d, q_d, v_d, t_d, a_d, o_d, bos,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    OUTPUT: tl.constexpr, STATE_DT: tl.constexpr, STATE_PRECISION: tl.constexpr, ROUND_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr, FORM_WU: tl.constexpr, CHUNK_DT: tl.constexpr, TMA: tl.constexpr,
    TMA_FACTORS: tl.constexpr, BETA_IN_T: tl.constexpr, BETA_ROWS: tl.constexpr,
):
    """`_walk_span` over the chunks of tokens [t_lo, t_hi) from state S, outputs from t_out on;
    returns the state at t_hi.  Both launches walk through here (inlined on a GPU).  A TMA store
    cannot be masked, so with TMA the warm-up chunks [t_lo, t_out) go first, without an output."""
    t_first = t_lo
    if TMA:
        S = _walk_span(
            S, t_lo, t_out, t_out, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
            v_p, svt, b_p, k_d, q_d, v_d, t_d, a_d, o_d, bos,
            HV, K, V, BK, BV, BT, False, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED, FORM_WU, CHUNK_DT, TMA, TMA_FACTORS, BETA_IN_T, BETA_ROWS,
        )  # fmt: skip
        t_first = t_out
    return _walk_span(
        S, t_first, t_out, t_hi, eos, k_p, w_p, u_p, gc_p, kf_p, q_p, qf_p, aqk_p, o_p, ncols, use_u, skt, sqt,
        v_p, svt, b_p, k_d, q_d, v_d, t_d, a_d, o_d, bos,
        HV, K, V, BK, BV, BT, OUTPUT, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED, FORM_WU, CHUNK_DT, TMA, TMA_FACTORS, BETA_IN_T, BETA_ROWS,
    )  # fmt: skip
# fmt: on


@triton.jit(do_not_specialize=["T", "P"])
def _warmup_plan_kernel(
    lb,
    cw,
    cu_seqlens,
    warmup_log_bound,
    T,
    NT,
    P,
    HV: tl.constexpr,
    BT: tl.constexpr,
    WB: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """Launch 2, grid ``(N·HV, P)``: where segment s of one sequence and value head warms up from
    (`delta_rule_common.warmup_start`), into ``cw``, for keys launch 1 does not normalise (from
    the bounds launch 1 stored, `lb`; with normalised keys launch 1's first programs do this from
    the gates, `delta_rule_prepare._chunk_prepare_kernel`).  Not inside the walk: the walk back's
    loop there made the walk spill 130 more bytes per thread on sm_90."""
    i_nh = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1).to(tl.int64)
    n = i_nh // HV
    hv = i_nh % HV
    _, bos, eos = _seq_bounds(n, cu_seqlens, T, IS_VARLEN)
    seg = tl.cdiv(tl.cdiv(eos - bos, BT), P)
    c_lo = tl.minimum(s * seg, tl.cdiv(eos - bos, BT))
    slot0 = bos // BT + n if IS_VARLEN else n * NT  # the sequence's first chunk slot
    c_w = warmup_start(
        lb + slot0 * HV + hv, lb, lb, c_lo, bos, eos, warmup_log_bound, HV, BT, WB, False
    )  # fmt: skip
    tl.store(cw + i_nh * P + s, c_w.to(tl.int32))


@triton.jit(do_not_specialize=["T", "P", "NS"])
def _segment_output_kernel(
    q,
    k,
    v,
    beta,
    bt,
    w,
    u,
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
    FORM_WU: tl.constexpr,
    CHUNK_DT: tl.constexpr,
    TMA: tl.constexpr = False,
    TMA_FACTORS: tl.constexpr = 0,
    BETA_IN_T: tl.constexpr = False,
    BETA_ROWS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Segment s of one sequence, value head and V block: its start state from a warm-up walk
    over the chunks before it, then its chunks with the output fused.  With FORM_WU, w holds
    launch 1's T per chunk and u the factors of k̂'s rows, and each step forms w and u.  With TMA
    (FORM_WU only) the walk moves its tiles by tensor descriptors of this sequence's rows
    (`tma_eligible`)."""
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
    if FORM_WU:  # the state's block held transposed, [BV, BK] (`_split_step_vk`)
        s_off = rv[:, None] + rk[None, :] * V
        s_mask = (rv < ncols)[:, None] & (rk < K)[None, :]
    else:
        s_off = rk[:, None] * V + rv[None, :]
        s_mask = (rk < K)[:, None] & (rv < ncols)[None, :]
    h0 += i_nh * K * V + c0
    ht += i_nh * K * V + c0
    seg = tl.cdiv(tl.cdiv(eos - bos, BT), P)  # chunks per segment
    t_lo = tl.minimum(bos + s * seg * BT, eos)
    t_hi = tl.minimum(bos + (s + 1) * seg * BT, eos)
    t_w = bos  # where the walk starts: from the initial state at the sequence start, or ...
    if PDL:  # launched as a dependant: launch 1's (and 2's) results are complete from here on
        gdc_wait()
    if WARMUP:  # ... from zero at the first chunk whose map onto t_lo is below the bound
        c_w = tl.load(cw + i_nh * P + s).to(tl.int64)  # `warmup_start`, from launch 1 or 2
        t_w = tl.where(c_w < 0, bos, bos + c_w * BT)
        from_start = c_w < 0
    else:
        from_start = s == s
    if HAS_H0:
        S = tl.load(h0 + s_off, mask=s_mask & from_start, other=0.0)
    elif FORM_WU:
        S = tl.zeros([BV, BK], dtype=tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)

    k_p = k + b * skb + h * K
    q_p = q + b * sqb + h * K
    tok = b * T * HV + hv
    hd = (b * HV + hv) * T
    # the sequence's per-token factors by chunk slot (launch 1's [B, HV, NS, BT]), offset so that
    # token t0's chunk is at `+ t0` as in the token-indexed tensors
    slot0 = bos // BT + n if IS_VARLEN else n * 0  # its first slot in the batch row
    fd = ((b * HV + hv) * NS + slot0) * BT
    if FORM_WU:
        w_p = w + tok * BT
        u_p = u + fd - bos
    else:
        w_p = w + tok * K
        u_p = u + tok * V + c0
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
        t_d = tl.make_tensor_descriptor(w_p + bos * (HV * BT), [nrow, BT], [HV * BT, 1], [BT, BT])
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
    b_h = bt + fd - bos if BETA_ROWS else beta + tok
    if TMA_FACTORS > 0:
        # the per-token factors by TMA too, through 1-D descriptors over the sequence's
        # [eos - bos) (each chunk's 64 start 256-byte aligned, launch 1's slots); past the end
        # they read zeros, as the masked loads give them
        nfac = (eos - bos).to(tl.int32)
        kf_h = tl.make_tensor_descriptor(kf + fd, [nfac], [1], [BT])
        u_p = tl.make_tensor_descriptor(u + fd, [nfac], [1], [BT])
        if TMA_FACTORS > 1:  # also β (`factor_descriptors`)
            b_h = tl.make_tensor_descriptor(bt + fd, [nfac], [1], [BT])
    # the warm-up chunks [t_w, t_lo) (their outputs dropped), then the segment's own
    S = _walk(
        S, t_w, t_lo, t_hi, eos, k_p, w_p, u_p, gc + hd, kf_h, q_p, qf_h, aqk_p, o_p,
        ncols, True, skt, sqt, v_p, svt, b_h, k_d, q_d, v_d, t_d, a_d, o_d, bos,
        HV, K, V, BK, BV, BT, True, STATE_DT, STATE_PRECISION, ROUND_BF16, INTERPRETED, FORM_WU, CHUNK_DT, TMA, TMA_FACTORS, BETA_IN_T,
        BETA_ROWS,
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked delta rule in the split design (same contract as
    `clef_runtime.ops.delta_rule_chunk.chunk_gated_delta_rule`).  ``segments``: per sequence
    (None: `default_segments`); ``block_v``, ``warps``, ``stages``: the walk's column block, warps
    and pipeline stages (for measurements; None: the kept ones, `walk_shape`, or SPLIT_BV and
    SPLIT_WARPS with FORM_WU off, and SPLIT_STAGES).  Raises ValueError where the device takes the FMA
    configuration (float32, sm70): that path has the three-launch design only."""
    _, T, H, HV, K, V, N, scale = checked_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    if not tensor_core_dots(q.dtype, q.device):
        raise ValueError(f"{OP}: the split design runs on tensor cores only (16-bit inputs, sm80+)")
    return run_split(
        q, k, v, g, beta, (T, H, HV, K, V, N), scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm,
        segments, block_v, warps, stages,
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunk_gated_delta_rule_split` on inputs already checked (`checked_inputs`: ``dims`` is its
    (T, H, HV, K, V, N), ``scale`` its scale) and on tensor cores: what
    `delta_rule_chunk.chunk_gated_delta_rule` hands over, so that a call checks its inputs once
    (the checks cost tens of µs of host time a call); ``rec`` records its launches for a plan
    (`delta_rule_plan`)."""
    T, H, HV, K, V, N = dims
    P = default_segments(N, HV, V, T) if segments is None else int(segments)
    if P < 1:
        raise ValueError(f"{OP}: segments must be ≥ 1, got {P}")
    fold = FORM_WU
    beta_in_t = fold and BETA_IN_T
    tma = fold and T > 0 and tma_eligible(q, k, v)
    pdl = PDL and tma and q.device.type == "cuda" and not interpreted(_segment_output_kernel)
    # (the walk by per-thread copies keeps the input's β: with β by slot its 64-wide form spills
    # 16 bytes more on sm_90, and it was not measured so)
    beta_rows = tma and BETA_ROWS and not beta_in_t
    # launch 1 stores the chunk bounds only for keys it does not normalise (with normalised keys
    # the gates give them: `chunk_bounds`); they cost it 14% at B1 T32768 on the H200.  With
    # normalised keys launch 1 also finds the segments' warm-up starts (its first N·HV·P
    # programs), so launch 2 runs only for keys it does not normalise: one launch fewer, ~5 µs
    # of host time a call on the H200's host (docs/performance.md, "Host time per chunked call").
    # Unsplit calls (P = 1) keep launch 1 without those programs.
    P_warm = P > 1
    p = prepare(
        q, k, v, g, beta, N, scale, cu_seqlens, use_qk_l2norm, output_final_state, True,
        P_warm and not use_qk_l2norm, fold, beta_in_t, beta_rows, pdl,
        extra=(((N * HV * P,), torch.int32) if P_warm else None,), rec=rec,
        warmup_plan=(P, WARMUP_LOG_BOUND, WARMUP_BLOCK) if use_qk_l2norm and P_warm else None,
    )  # fmt: skip
    policy, cfg = p.policy, p.cfg
    if fold:
        walk_bv, walk_warps = walk_shape(N * HV * cdiv(V, FOLD_BV) * P, _sm_count(q.device))
    else:
        walk_bv, walk_warps = SPLIT_BV, SPLIT_WARPS
    BV = min(block_v or walk_bv, cfg.BVF)
    varlen = cu_seqlens is not None
    cw = p.gc  # an unused pointer with one segment
    if P_warm:
        assert p.extra[0] is not None
        cw = p.extra[0]
    if P_warm and not use_qk_l2norm:
        assert p.lb is not None
        plain_launch(
            rec, _warmup_plan_kernel, (N * HV, P),
            (p.lb, cw, p.cu, WARMUP_LOG_BOUND, T, p.NT, P),
            dict(HV=HV, BT=BT, WB=WARMUP_BLOCK, IS_VARLEN=varlen, num_warps=4),
        )  # fmt: skip
    walk_stages = pipeline_stages(tma, BV, policy.state_dtype)
    tma_factors = factor_descriptors(tma, BV, beta_rows)
    # the descriptors need global scratch memory from Triton's allocator: ours for this launch,
    # unless the caller has set one (`delta_rule_plan.launch_with_scratch`)
    plain_launch(
        rec, _segment_output_kernel, (N * HV, cdiv(V, BV), P),
        (
            q, k, v, beta, p.bt if p.bt is not None else p.gc, p.w, p.u, p.gc, p.kf, p.qf, p.aqk, p.o, cw,
            initial_state if initial_state is not None else p.gc,
            p.final if p.final is not None else p.gc,
            p.cu, T, P, p.NS, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        ),
        dict(
            H=H, HV=HV, K=K, V=V, BK=cfg.BK, BV=BV, BT=BT, IS_VARLEN=varlen,
            HAS_H0=initial_state is not None, STORE_FINAL=p.final is not None,
            STATE_DT=policy.state_dtype, STATE_PRECISION=policy.state_precision, WARMUP=P_warm,
            ROUND_BF16=policy.round_bf16, INTERPRETED=interpreted(_segment_output_kernel),
            FORM_WU=fold, CHUNK_DT=policy.chunk_dtype, TMA=tma, TMA_FACTORS=tma_factors,
            BETA_IN_T=beta_in_t, BETA_ROWS=beta_rows, PDL=pdl, launch_pdl=pdl,
            num_warps=warps or walk_warps, num_stages=stages or walk_stages,
        ),
        scratch=q.device if tma else None,
    )  # fmt: skip
    return p.o, p.final


def tunables() -> tuple[object, ...]:
    """The settings of this module that the host side reads: part of a plan's key
    (`delta_rule_chunk.plan_key`), so that a test or probe that changes one gets a new plan."""
    return (
        SPLIT_BV, SPLIT_WARPS, SPLIT_STAGES, UNSPLIT_PROGRAMS, TARGET_PROGRAMS, MIN_SEGMENT_CHUNKS,
        MAX_SEGMENTS, WARMUP_LOG_BOUND, WARMUP_BLOCK, DEFAULT_MIN_CHAINS, DEFAULT_MIN_SPLIT_TOKENS,
        FORM_WU, FOLD_BV, FOLD_WARPS, WIDE_BV, WIDE_WARPS, WIDE_PER_SM, WIDE_STAGES, TMA_TILES,
        TMA_FACTORS, BETA_ROWS, TMA_WIDE_FACTORS, PDL, BETA_IN_T,
    )  # fmt: skip
