"""The chunked delta rule's per-GPU choices, as data: the tiles, warps, stages and register caps
of every launch (`LaunchConfig`, by head dims, input dtype and tensor cores or FMA dots) and the
split design's walk (`WalkConfig`, by the device's compute capability).  The kernels take these
as compile-time arguments; nothing else chooses a tile.

Every number here was measured on the H200 (docs/performance.md, "What was tried and why it
lost", has what lost) and checked with ptxas for sm_90 and sm_70
(tests/runtime/test_ops_compile.py): the FMA configuration (float32 everywhere, 16-bit inputs on
the V100, where Triton 3.6 has no MMA) was sized for sm_70's registers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton.language as tl

from clef_runtime.ops.delta_rule_common import capability, pow2_at_least


@dataclass(frozen=True)
class LaunchConfig:
    """Tile sizes, warps and stages of the launches (see `launch_config`)."""

    BK: int  # K padded to a power of two (one tile)
    BVF: int  # V likewise
    KS: int  # launch 1: K slice of the Gram matrices and w
    VS: int  # launch 1: V slice of u
    BV: int  # launch 2: V block per program
    BVO: int  # launch 3: V block per program
    warps1: int
    warps2: int
    stages2: int
    warps3: int
    solve_by_doubling: bool  # launch 1: how the 16×16 diagonal blocks are inverted
    solve_dt: tl.dtype  # launch 1: operand dtype of the solve's dots
    regs1: int | None  # launch 1: register cap per thread (None: the compiler's choice)
    regs1_t: int | None  # the same for the split design's launch 1 (T stored: `prepare`'s t_out)


def launch_config(K: int, V: int, dtype: torch.dtype, tensor_cores: bool) -> LaunchConfig:
    """The tiles for head dims K, V and input `dtype`, on tensor cores or on the FMA path.

    Checked with ptxas for sm_90 and sm_70 at K = V = 128 (no spills on sm_90 but under launch
    1's register caps, under 1 KB per thread on sm_70) and timed on the H200.  On tensor cores
    launch 1 takes K/V in slices of up to 128 (whole heads at K = V = 128); launch 2 takes 32-wide
    V blocks at 4 warps and 3 stages, except for f16, whose state dots take float32 operands and
    want 8 warps; launch 3 takes 128-wide V blocks at 4 warps for bf16 and 64-wide ones for f16,
    whose float32 state tiles would spill at 128 on sm_90.  On the FMA path every dot holds whole
    operand rows per thread: 16-wide slices and blocks, 8 warps and no software pipelining keep
    the spills under 1 KB per thread (launch 3 at 128-wide blocks would spill 11 KB on sm_70)."""
    BK, BVF = pow2_at_least(K), pow2_at_least(V)
    if tensor_cores:
        # On an H200 (Triton 3.6) tensor-core dots with a 16-wide K or V tile gave wrong sums
        # (K=32/V=16 and K=V=16 heads, f16 and bf16; K, V ≥ 32 and float32 were right), which
        # the interpreter cannot show.  Padding the tiles to 32 (masked) avoids those shapes.
        BK, BVF = max(BK, 32), max(BVF, 32)
        small = max(K, V) <= 128
        bf16 = dtype == torch.bfloat16
        return LaunchConfig(
            BK=BK, BVF=BVF, KS=min(128, BK), VS=min(128, BVF), BV=min(32, BVF),
            BVO=min(128 if bf16 else 64, BVF),
            warps1=4 if small else 8, warps2=4 if bf16 and small else 8, stages2=3,
            warps3=4, solve_by_doubling=True,
            # bf16: the solve's dots with f16 operands (float32 accumulation) instead of TF32:
            # TF32's 11-bit significand in a narrower range (|T| ≤ 1.8 in
            # hack/solve_precision_emulation.py) at twice the rate, in half the registers; on the
            # H200 launch 1 421.8 → 338.8 µs at B1 T32768, errors against the float64 reference no
            # larger.  f16 inputs keep float32 operands (T's 11 bits at 3xTF32/TF32).
            solve_dt=tl.float16 if bf16 else tl.float32,
            # 168 registers let three 4-warp programs share an SM instead of two (it spills a few
            # bytes): launch 1 at B1 T32768 went 813 → 690 µs on the H200 with the 3xTF32 solve,
            # in bf16; f16 was not timed with the cap, so it keeps the compiler's choice.
            regs1=168 if small and bf16 else None,
            # the split design's launch 1 (T stored, the f16 solve) at 128: four programs per SM,
            # 24 bytes of spill; on the H200 346 → 326 µs at B1 T32768, 363 → 338 for 8 packed ×
            # 4096, the whole call 1.01-1.03× faster
            regs1_t=128 if small and bf16 else None,
        )  # fmt: skip
    return LaunchConfig(
        BK=BK, BVF=BVF, KS=min(16, BK), VS=min(16, BVF), BV=min(16, BVF), BVO=min(16, BVF),
        warps1=8, warps2=8, stages2=1, warps3=8, solve_by_doubling=False, solve_dt=tl.float32,
        regs1=None, regs1_t=None,
    )  # fmt: skip


@dataclass(frozen=True)
class WalkConfig:
    """The split design's walk (`delta_rule_chunk_split`) on one GPU: 16-bit inputs on tensor
    cores only (sm_80 and later, and the interpreter).

    The walk takes whole-V blocks (``wide_bv``, ``wide_warps``) where its tiles come by TMA with
    16-bit state operands and its chains fill a wave (narrower blocks, down to ``narrow_bv``, at
    ``fold_warps`` where they do not), or where a grid of ``fold_bv``-wide V blocks at
    ``fold_warps`` warps (two programs fit an SM's registers) would hold more than ``wide_per_sm``
    programs per SM: whole-V blocks read k, q, T and Aqk once per chunk and value head instead of
    once per V block (`delta_rule_chunk_split.walk_shape`).  With ``tma`` (sm_90) its tiles, two of its per-token factors
    and its output move by TMA through tensor descriptors over each sequence's rows; the two
    factors are loaded instead by a short unsplit walk in narrow V blocks (sequences of fewer than
    ``tma_factor_chunks`` chunks: `delta_rule_chunk_split.tma_factors`)."""

    tma: bool
    fold_bv: int = 64
    fold_warps: int = 4
    wide_bv: int = 128
    wide_warps: int = 8
    wide_per_sm: int = 2
    narrow_bv: int = 32  # the narrowest V block of a short walk with TMA tiles (`walk_shape`)
    stages: int = 2  # two 64-wide walks must fit an SM's shared memory
    # the whole-V walk with TMA tiles and bf16 state operands (one program per SM; its k, q, v, T
    # and Aqk tiles are 64 KB a stage): 8 packed × 4096 went 819.7 → 784.1 µs on the H200
    wide_stages: int = 3
    # an unsplit narrow-V walk takes k's and w's factors by TMA from this many chunks a
    # sequence: each descriptor costs its program ~1,100 cycles before its first step (H100
    # 2026-12-07, B1 T512: the walk's prologue 9,100 of its 34,800 cycles, eight descriptors),
    # which a short walk does not win back: B1 T512 graph 31.0 → 29.3 µs without the two (30.2 →
    # 28.8 without the norm). Split and whole-V walks keep them (B1 T2048, whole-V, 8 chunks a
    # segment and its warm-ups: 74.0 → 74.8 µs without; short whole-V batches not measured); on
    # the H200 they took B1 T32768's walk 775.5 → 762.9 µs (docs/performance.md)
    tma_factor_chunks: int = 32


@functools.lru_cache(maxsize=16)
def walk_config(device: torch.device) -> WalkConfig:
    """The walk's configuration on `device`: tiles by TMA from compute capability 9 (the
    interpreter stands in for one on the CPU).  On the H200 TMA made the walk 633 → 445 µs at B1
    T32768 (the whole call 1.20-1.24× faster), bit-identical: its per-thread copies' address and
    mask arithmetic (~540 instructions of a 1328-instruction step) and its spills went away."""
    return WalkConfig(tma=device.type != "cuda" or capability(device)[0] >= 9)
