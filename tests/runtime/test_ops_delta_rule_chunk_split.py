"""The split design of the chunked delta rule (`clef_runtime.ops.delta_rule_chunk_split`: the
output fused into the recurrence, sequences cut into segments that start from a warm-up walk)
against the float64 reference, as the three-launch design is tested.

CPU tier: small shapes under ``TRITON_INTERPRET=1``, with more segments than a sequence has
chunks (empty segments), uneven segments, varlen with empty sequences, an initial state, and
one segment (the plain fused recurrence); warm-ups cut short by fast decay, warm-ups that must
reach the sequence start (no decay; keys with β|k|² > 2), and a decay slow enough that a
warm-up cut too early fails; launch 1's warm-up starts per value head, key head and packed
sequence.  GPU tier: the Qwen3.5 shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
import triton.language as tl
from tests.runtime.test_ops_delta_rule_chunk import OP, QWEN, check_against_reference, packed_cu_seqlens

from clef_runtime.compare import assert_close
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops import delta_rule_chunk_split as ds
from clef_runtime.ops import delta_rule_prepare as dp
from clef_runtime.ops.delta_rule_chunk_split import (
    WARMUP_BLOCK,
    WARMUP_BLOCK_KEYS,
    WARMUP_FIRST_BLOCK,
    WARMUP_LOG_BOUND,
    chunk_gated_delta_rule_split,
    default_segments,
    pipeline_stages,
    takes_default_path,
    tma_eligible,
    tma_factors,
    walk_shape,
    wide_tiles,
)
from clef_runtime.ops.delta_rule_common import dot_policy
from clef_runtime.ops.delta_rule_config import WalkConfig, walk_config
from clef_runtime.ops.delta_rule_prepare import BT, prepare
from clef_runtime.reference import delta_rule as ref
from clef_runtime.tolerances import tolerance


def split_op(segments: int | None) -> functools.partial[tuple[torch.Tensor, torch.Tensor | None]]:
    return functools.partial(chunk_gated_delta_rule_split, segments=segments)


CASES: dict[str, dict[str, object]] = {
    # 4 chunks in 3 segments of 2: the last segment is empty
    "T200-P3-h0-f16": dict(dtype="f16", P=3, B=1, T=200, H=2, HV=4, K=32, V=32, initial=True),
    # per-sequence segments: 2, 0, 3 and 1 chunks in 2 segments each
    "varlen-P2-h0-bf16": dict(dtype="bf16", P=2, lens=[70, 0, 130, 5], H=1, HV=2, K=32, V=32, initial=True),
    # one segment (no maps, the fused walk alone), B2, odd dims, no final state
    "B2-T130-P1-odd-dims-bf16": dict(dtype="bf16", P=1, B=2, T=130, H=1, HV=1, K=20, V=40, final=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_split_matches_reference(case: str, rng: torch.Generator, device: torch.device) -> None:
    kw = dict(CASES[case])
    dtype, P = str(kw.pop("dtype")), kw.pop("P")
    check_against_reference(rng, device, dtype, op=split_op(P), **kw)  # type: ignore[arg-type]


def chunk_log_bounds(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, l2norm: bool) -> torch.Tensor:
    """[B, chunks, HV]: each chunk's Σ (g + log max(1, |1 - β |k̂|²|)) as the kernels bound it
    (normalised keys: |k̂|² ≤ 1 gives max(1, |1 - β|))."""
    B, T, H, _ = k.shape
    HV = g.shape[2]
    nk2 = k.double().pow(2).sum(-1).repeat_interleave(HV // H, dim=2)
    if l2norm:
        nk2 = torch.ones_like(nk2)
    per_token = g.double() + torch.log(torch.clamp((1 - beta.double() * nk2).abs(), min=1.0))
    pad = -T % BT
    return torch.nn.functional.pad(per_token, (0, 0, 0, pad)).view(B, -1, BT, HV).sum(2)


def warmup_starts(bounds: torch.Tensor, P: int) -> list[int]:
    """Per segment of one sequence and head (`bounds`: [chunks]): the chunk its warm-up starts
    from, -1 where it reaches the sequence start (the kernel's rule, in float64)."""
    chunks = bounds.shape[0]
    seg = -(-chunks // P)
    starts = []
    for s in range(1, P):
        c_lo, acc, start = min(s * seg, chunks), 0.0, -1
        for c in range(c_lo - 1, -1, -1):
            acc += float(bounds[c])
            if acc < WARMUP_LOG_BOUND:
                start = c
                break
        starts.append(start)
    return starts


def check_split(
    rng: torch.Generator,
    device: torch.device,
    g_of: object,
    P: int,
    *,
    T: int = 0,
    lens: list[int] | None = None,
    HV: int = 1,
    l2norm: bool = True,
    k_norm: float | None = None,
) -> list[int]:
    """The split at P segments against the float64 reference (bf16, initial and final states),
    g drawn by `g_of(shape)`; returns the warm-up starts of sequence 0, head 0 (`warmup_starts`)."""
    cu = packed_cu_seqlens(lens, device) if lens is not None else None
    T = sum(lens) if lens is not None else T
    N = len(lens) if lens is not None else 1
    q, k, v, _, beta = gdn_inputs(rng, device, torch.bfloat16, B=1, T=T, H=1, HV=HV, K=32, V=32)
    if k_norm is not None:  # one un-normalised key for every token, |k|² = k_norm², and β = 1
        k = (k_norm * torch.nn.functional.normalize(k[:, :1].float(), dim=-1)).expand(1, T, 1, 32)
        k = k.to(torch.bfloat16).contiguous()
        beta = torch.ones_like(beta)
    g = g_of((1, T, HV)).to(device)  # type: ignore[operator]
    h0 = 0.1 * torch.randn(N, HV, 32, 32, generator=rng).to(device)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=l2norm)
    o, ht = chunk_gated_delta_rule_split(q, k, v, g, beta, segments=P, **kw)  # type: ignore[arg-type]
    ro, rht = ref.chunk_gated_delta_rule(q, k, v, g, beta, **kw)  # type: ignore[arg-type]
    tol = tolerance(OP, "bf16")
    assert torch.isfinite(ro).all() and torch.isfinite(rht).all()  # type: ignore[arg-type]
    assert_close(o, ro, tol, "split output")
    assert ht is not None and rht is not None
    assert_close(ht, rht, tol, "split final state")
    n0 = lens[0] if lens is not None else T
    return warmup_starts(chunk_log_bounds(k[:, :n0], g[:, :n0], beta[:, :n0], l2norm)[0, :, 0], P)


def uniform(lo: float, hi: float, rng: torch.Generator) -> object:
    return lambda shape: lo + (hi - lo) * torch.rand(*shape, generator=rng)


def test_warmup_cut_short_by_fast_decay(rng: torch.Generator, device: torch.device) -> None:
    """g ∈ (-0.5, -0.2): one chunk's bound is below 2⁻²⁴, so every warm-up is one chunk."""
    starts = check_split(rng, device, uniform(-0.5, -0.2, rng), 4, T=512)
    assert starts == [1, 3, 5]  # segments of 2 chunks, each warmed up from the chunk before it


def test_warmup_cut_by_a_decay_that_needs_it(rng: torch.Generator, device: torch.device) -> None:
    """g ∈ (-0.05, -0.03): the bound needs ~7 chunks, so the third and fourth segments' warm-ups
    are cut 7 chunks back while the second's reaches the sequence start; a warm-up cut after one
    chunk leaves ~8% of the start state out and fails this test (checked by forcing
    WARMUP_LOG_BOUND to 0)."""
    starts = check_split(rng, device, uniform(-0.05, -0.03, rng), 4, T=1024)
    assert starts[0] == -1 and 0 < starts[1] < 8 and 4 < starts[2] < 12


def test_warmup_longer_than_its_first_step(rng: torch.Generator, device: torch.device) -> None:
    """g ∈ (-0.0118, -0.0098) with normalised keys: the bound needs ~24 chunks, more than the
    plan's first step back (WARMUP_FIRST_BLOCK chunks), so the second segment's warm-up start is
    found by the steps after it.  Launch 1 stores the float64 rule's start (a step that lost the
    first one's sum would cut it short), and the split matches the reference."""
    T, P = 64 * BT, 2
    starts = check_split(rng, device, uniform(-0.0118, -0.0098, rng), P, T=T)
    assert starts[0] < T // BT // P - WARMUP_FIRST_BLOCK
    q, k, v, _, beta = gdn_inputs(rng, device, torch.bfloat16, B=1, T=T, H=1, HV=1, K=32, V=32)
    g = uniform(-0.0118, -0.0098, rng)((1, T, 1)).to(device)  # type: ignore[operator]
    rule = warmup_starts(chunk_log_bounds(k, g, beta, True)[0, :, 0], P)
    assert rule[0] < T // BT // P - WARMUP_FIRST_BLOCK
    p = prepare(
        q, k, v, g, beta, 1, 32**-0.5, None, True, False, True, True,
        extra=(((P,), torch.int32),), warmup_plan=(P, WARMUP_LOG_BOUND, WARMUP_BLOCK, WARMUP_FIRST_BLOCK),
    )  # fmt: skip
    assert p.extra[0] is not None
    assert p.extra[0].tolist() == [-1, *rule]


def test_warmup_reaches_the_start_without_decay(rng: torch.Generator, device: torch.device) -> None:
    """g = 0: no chunk's map shrinks, so every warm-up walks back to the initial state."""
    starts = check_split(rng, device, lambda shape: torch.zeros(*shape), 3, T=320)
    assert starts == [-1, -1]


def test_warmup_counts_keys_that_grow_the_state(rng: torch.Generator, device: torch.device) -> None:
    """One un-normalised key for every token, β |k|² = 3: each token's map doubles the state's
    part along k (|1 - 3| = 2), which g ∈ (-0.72, -0.68) barely outweighs, so every warm-up must
    reach the sequence start.  A bound that counted g alone would cut each after one chunk and
    fail this test (checked by dropping the |1 - β |k|²| term from `chunk_bounds`)."""
    starts = check_split(rng, device, uniform(-0.72, -0.68, rng), 4, T=512, l2norm=False, k_norm=3**0.5)
    assert starts == [-1, -1, -1]


def keys_of_norms(rng: torch.Generator, T: int, norms: list[float]) -> torch.Tensor:
    """[1, T, len(norms), 32] bf16: key head h repeats one key of norm ``norms[h]`` at every token."""
    k = torch.randn(1, 1, len(norms), 32, generator=rng)
    k = torch.nn.functional.normalize(k, dim=-1) * torch.tensor(norms)[:, None]
    return k.expand(1, T, len(norms), 32).to(torch.bfloat16).contiguous()


def check_starts_per_head(
    rng: torch.Generator,
    device: torch.device,
    k: torch.Tensor,
    beta: torch.Tensor,
    starts: list[list[int]],
    lens: list[int] | None = None,
) -> None:
    """Un-normalised keys `k`, gates β per value head (rows of `beta`) against g ≈ -0.7, in
    `len(starts[0])` segments, one sequence or packed ones of `lens` tokens (whole chunks): the
    warm-up starts launch 1 stores per (sequence, value head), each at its place, are `starts`
    (and the float64 rule's), and the split's output matches the reference.  A start stored at
    another head's place could still give right outputs by luck, hence both checks."""
    T, HV, P = k.shape[1], beta.shape[0], len(starts[0])
    lens = lens or [T]
    assert sum(lens) == T and all(n % BT == 0 for n in lens)
    N, cu = len(lens), packed_cu_seqlens(lens, device) if lens != [T] else None
    q, _, v, _, _ = gdn_inputs(rng, device, torch.bfloat16, B=1, T=T, H=k.shape[2], HV=HV, K=32, V=32)
    k = k.to(device)
    g = (-0.72 + 0.04 * torch.rand(1, T, HV, generator=rng)).to(device)
    beta = beta.T[None].expand(1, T, HV).contiguous().to(device)
    bounds = chunk_log_bounds(k, g, beta, l2norm=False)[0]
    first = [sum(lens[:n]) // BT for n in range(N + 1)]  # each sequence's chunks
    rule = [[-1, *warmup_starts(bounds[first[n] : first[n + 1], h], P)] for n in range(N) for h in range(HV)]
    assert rule == starts
    p = prepare(
        q, k, v, g, beta, N, 32**-0.5, cu, False, False, True, True,
        extra=(((N * HV * P,), torch.int32),), warmup_plan=(P, WARMUP_LOG_BOUND, WARMUP_BLOCK_KEYS, 0),
    )  # fmt: skip
    assert p.extra[0] is not None
    assert p.extra[0].view(N * HV, P).tolist() == starts
    h0 = 0.1 * torch.randn(N, HV, 32, 32, generator=rng).to(device)
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm=False, cu_seqlens=cu)
    o, ht = chunk_gated_delta_rule_split(q, k, v, g, beta, segments=P, **kw)  # type: ignore[arg-type]
    ro, rht = ref.chunk_gated_delta_rule(q, k, v, g, beta, **kw)  # type: ignore[arg-type]
    tol = tolerance(OP, "bf16")
    assert_close(o, ro, tol, "split output, per-head bounds")
    assert ht is not None and rht is not None
    assert_close(ht, rht, tol, "split final state, per-head bounds")


def test_warmup_bounds_per_value_head(rng: torch.Generator, device: torch.device) -> None:
    """Two value heads of one key head with their own gates, the keys as in
    `test_warmup_counts_keys_that_grow_the_state` (|k|² = 3): head 1 is that test's (β = 1
    against g ≈ -0.7), so its warm-ups must reach the sequence start, while head 0 (β = 0.1, the
    same g) has no growth to count and cuts each after one chunk.  Head 1's bound formed with
    head 0's β, or its start stored at head 0's place, fails this test."""
    k = keys_of_norms(rng, 512, [3**0.5])
    check_starts_per_head(rng, device, k, torch.tensor([[0.1], [1.0]]), [[-1, 1, 3, 5], [-1, -1, -1, -1]])


def test_warmup_bounds_per_key_head(rng: torch.Generator, device: torch.device) -> None:
    """Two key heads, one value head each, β = 1: key head 0's keys are unit vectors (|1 - β|k|²|
    ≈ 0: no growth, each warm-up cut after one chunk), key head 1's have |k|² = 3 (its warm-ups
    must reach the sequence start).  Value head 1's bound formed from key head 0's keys fails
    this test."""
    k = keys_of_norms(rng, 512, [1.0, 3**0.5])
    check_starts_per_head(rng, device, k, torch.tensor([[1.0], [1.0]]), [[-1, 1, 3, 5], [-1, -1, -1, -1]])


def test_warmup_bounds_per_packed_sequence(rng: torch.Generator, device: torch.device) -> None:
    """Two packed sequences of 256 tokens, two segments each, β = 1: the first's keys are unit
    vectors (its second segment warms up from the chunk before it), the second's have |k|² = 3
    (it must walk back to its start).  A plan reading the second sequence's keys from the first's
    rows (the offset from its start lost) fails this test."""
    k = torch.cat([keys_of_norms(rng, 256, [1.0]), keys_of_norms(rng, 256, [3**0.5])], dim=1)
    check_starts_per_head(rng, device, k, torch.tensor([[1.0]]), [[-1, 1], [-1, -1]], lens=[256, 256])


def test_warmup_varlen_with_empty_and_short_sequences(rng: torch.Generator, device: torch.device) -> None:
    """Per-sequence segments and warm-ups, g from the model's gating: sequences of 0 and 5 tokens
    (empty segments whose last one warms up to the sequence end to store the final state)."""
    q_lens = [300, 0, 5, 200, 64]

    def model_g(shape: tuple[int, ...]) -> torch.Tensor:
        return gdn_inputs(
            rng, torch.device("cpu"), torch.float32, B=1, T=shape[1], H=1, HV=shape[2], K=1, V=1
        )[3]

    check_split(rng, device, model_g, 3, lens=q_lens)
    assert math.isfinite(WARMUP_LOG_BOUND)


def tma_and_masked(
    rng: torch.Generator,
    device: torch.device,
    layout: str,
    wide_bv: int | None = None,
    factors: bool = True,
    **dims: int,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The split design's output and final state with the walk's tiles by TMA and by masked
    loads, on the same inputs: an initial state, V blocks narrower than V; "varlen"
    has an empty sequence and sequences that end inside a chunk (at tokens 70, 200 and 205: no
    chunk but the first starts at a multiple of 4), "dense" a T that does too (150: not a
    multiple of 4), "dense-aligned" one that is (148).  With ``factors`` k's and w's per-token
    factors come by TMA with the tiles (launch 1 stores them by chunk slot, so every chunk's start
    is aligned), split into 2 segments; without it by masked loads, unsplit (as a short unsplit
    walk in narrow V blocks takes them, `tma_factors`).
    ``wide_bv``: the V block the walk's configuration counts as whole-V."""
    cfg = walk_config(device)
    P, BV = (2 if factors else 1), dims["V"] // 2
    if wide_bv is not None:
        cfg = dataclasses.replace(cfg, wide_bv=wide_bv)
    if layout.startswith("varlen"):
        lens = [70, 0, 130, 5]
        cu: torch.Tensor | None = packed_cu_seqlens(lens, device)
        B, T, N = 1, sum(lens), len(lens)
    else:
        cu, B, T = None, 2, 148 if layout.endswith("-aligned") else 150
        N = B
    assert (T % 4 == 0) == (layout == "dense-aligned")
    q, k, v, g, beta = gdn_inputs(rng, device, torch.bfloat16, B=B, T=T, **dims)
    h0 = torch.randn(N, dims["HV"], dims["K"], dims["V"], generator=rng).to(device)
    assert tma_eligible(cfg, q, k, v)
    assert tma_factors(cfg, True, N, B * T, P, False) == factors  # BV < V: narrow blocks
    out = []
    for tiles in (True, False):
        o, ht = chunk_gated_delta_rule_split(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=True,
            segments=P, block_v=BV, config=dataclasses.replace(cfg, tma=tiles),
        )  # fmt: skip
        assert ht is not None
        out.append((o, ht))
    return out[0], out[1]


@pytest.mark.parametrize("factors", [True, False], ids=["factors-by-tma", "factors-loaded"])
@pytest.mark.parametrize("layout", ["varlen", "dense", "dense-aligned"])
def test_tma_tiles_give_the_masked_loads_results(
    layout: str, factors: bool, rng: torch.Generator, device: torch.device
) -> None:
    """The walk's tiles by TMA (`WalkConfig.tma`: each program's tensor descriptors over its
    sequence's rows, which read rows past the sequence end as zeros and do not write them) give
    the masked loads' outputs and final states to the bit, here in the interpreter.  A descriptor
    that let a partial chunk's rows through, or wrote the output rows past a sequence end (into
    the next sequence's), fails this test; so does a per-token factor past a sequence end (the
    next sequence's, by TMA too) that reached an output or a state.  With ``factors`` off the
    factors come by masked loads beside the TMA tiles (a short unsplit walk's, `tma_factors`)."""
    (o1, h1), (o0, h0) = tma_and_masked(rng, device, layout, factors=factors, H=1, HV=2, K=32, V=64)
    assert torch.equal(o1, o0) and torch.equal(h1, h0)


@pytest.mark.parametrize("layout", ["varlen", "dense"])
def test_wide_walk_by_tma_gives_the_masked_loads_results(
    layout: str, rng: torch.Generator, device: torch.device
) -> None:
    """The whole-V walk (three pipeline stages with TMA) gives the masked loads' outputs and final
    states, to the bit.  Here the test's V block stands for the whole-V one."""
    (o1, h1), (o0, h0) = tma_and_masked(rng, device, layout, wide_bv=32, H=1, HV=2, K=32, V=64)
    assert torch.equal(o1, o0) and torch.equal(h1, h0)


def test_factors_loaded_only_by_short_unsplit_narrow_walks() -> None:
    """k's and w's factors are loaded (not by TMA) only where that was measured faster: an
    unsplit walk in V blocks narrower than V over sequences averaging fewer than
    ``tma_factor_chunks`` chunks (64 tokens each); never by TMA without TMA tiles.  N sequences
    share the tokens."""
    cfg = WalkConfig(tma=True, tma_factor_chunks=32)
    assert not tma_factors(cfg, True, 1, 512, 1, False)  # B1 T512: 8 chunks, unsplit, 32-wide
    assert not tma_factors(cfg, True, 1, 31 * 64, 1, False)  # 31 chunks
    assert tma_factors(cfg, True, 1, 31 * 64 + 1, 1, False)  # 31 chunks and one token: 32
    assert tma_factors(cfg, True, 1, 2048, 4, True)  # B1 T2048: 8 a segment, split, whole-V
    assert tma_factors(cfg, True, 1, 2048, 4, False)  # split, narrow
    assert tma_factors(cfg, True, 4, 4 * 512, 1, True)  # B4 T512: unsplit but whole-V
    assert tma_factors(cfg, True, 8, 32768, 1, True)  # 8 packed × 4096
    assert tma_factors(cfg, True, 1, 32768, 4, True)
    assert not tma_factors(cfg, True, 2, 2 * 900, 1, False)  # B2 T900: 15 chunks, 64 chains
    assert not tma_factors(cfg, False, 1, 32768, 4, True)  # no TMA tiles


def test_tma_needs_aligned_rows(rng: torch.Generator, device: torch.device) -> None:
    """Descriptors need 16-byte aligned rows: head dims or token strides that are not whole
    16-byte units keep the masked loads (the odd-dims case above runs them); so does a GPU
    without TMA."""
    cfg = WalkConfig(tma=True)
    q, k, v, _, _ = gdn_inputs(rng, device, torch.bfloat16, B=1, T=8, H=1, HV=1, K=32, V=32)
    assert tma_eligible(cfg, q, k, v)
    assert not tma_eligible(WalkConfig(tma=False), q, k, v)
    q20, k20, v20, _, _ = gdn_inputs(rng, device, torch.bfloat16, B=1, T=8, H=1, HV=1, K=20, V=40)
    assert not tma_eligible(cfg, q20, k20, v20)
    wide = torch.zeros(1, 8, 1, 36, dtype=torch.bfloat16, device=device)[..., :32]  # token stride 36
    assert not tma_eligible(cfg, wide, k, v)


def test_split_refuses_the_fma_configuration(device: torch.device) -> None:
    q = torch.zeros(1, 4, 1, 16, device=device)
    v = torch.zeros(1, 4, 1, 16, device=device)
    g = torch.zeros(1, 4, 1, device=device)
    with pytest.raises(ValueError, match="tensor cores only"):
        chunk_gated_delta_rule_split(q, q, v, g, g)


def test_default_segments() -> None:
    # B1 at the model's heads: 32 whole-V programs -> 4 segments, one program per SM
    assert default_segments(1, 32, 128, 32768) == 4
    assert default_segments(4, 32, 128, 8192) == 1  # 128 programs: unsplit
    assert default_segments(2, 32, 128, 8192) == 2  # 64 -> 128
    # 96 programs: two segments would make 192, past one wave on 132 SMs
    assert default_segments(3, 32, 128, 8192) == 1
    assert default_segments(1, 40, 128, 8192) == 3  # 120
    assert default_segments(1, 32, 128, 1024) == 4  # from MIN_SEGMENT_TOKENS on average
    assert default_segments(1, 32, 128, 1023) == 1
    assert default_segments(1, 32, 128, 512) == 1
    assert default_segments(2, 32, 128, 2047) == 1  # two sequences, 1023 tokens each
    assert default_segments(2, 32, 128, 2048) == 2  # B2 T1024: 2 x 1024 tokens in all
    assert default_segments(1, 1, 16, 1024) == 4  # 16 chunks: segments of at least 4
    assert default_segments(1, 1, 16, 1 << 20) == 16  # capped


def test_walk_shape() -> None:
    # whole-V 8-warp programs where the tiles come by TMA with 16-bit state operands and the
    # chains fill a wave (B4 T8192: 128 programs, measured 9% faster than 256 64-wide ones); fewer
    # chains (B1 T512 unsplit: 32) take narrower blocks at 4 warps until they do, down to 32.
    # Without TMA: 64-wide programs while two per SM hold the grid, whole-V beyond (8 packed ×
    # 4096: 256 chains)
    cfg = WalkConfig(tma=True)
    wide = (cfg.wide_bv, cfg.wide_warps)
    assert wide == (128, 8) and cfg.narrow_bv == 32
    for chains in (128, 132, 256):
        assert walk_shape(cfg, chains, 128, 132, True) == wide
    assert walk_shape(cfg, 127, 128, 132, True) == (64, 4)
    assert walk_shape(cfg, 64, 128, 132, True) == (64, 4)
    assert walk_shape(cfg, 63, 128, 132, True) == (32, 4)
    assert walk_shape(cfg, 32, 128, 132, True) == (32, 4)
    assert walk_shape(cfg, 1, 128, 132, True) == (32, 4)  # no narrower than narrow_bv
    # 64 columns: 64 chains x two 32-wide blocks; 128 chains whole-V (`run_split` clips the
    # block to the head)
    assert walk_shape(cfg, 64, 64, 132, True) == (32, 4)
    assert walk_shape(cfg, 128, 64, 132, True) == wide
    assert walk_shape(cfg, 128, 128, 132, False) == (cfg.fold_bv, cfg.fold_warps) == (64, 4)
    assert walk_shape(cfg, 132, 128, 132, False) == (64, 4)
    assert walk_shape(cfg, 133, 128, 132, False) == wide
    assert walk_shape(cfg, 256, 128, 132, False) == wide


def test_wide_tiles() -> None:
    # TMA tiles and 16-bit state operands (bf16) only: f16's state operands are float32
    assert wide_tiles(True, tl.bfloat16)
    assert not wide_tiles(False, tl.bfloat16)
    assert not wide_tiles(True, tl.float32)


def test_pipeline_stages() -> None:
    # three for the whole-V walk with TMA tiles and bf16 state operands (measured: 8 packed ×
    # 4096 1.04× faster), two for the rest: 64-wide (two per SM), masked loads, f16 (float32
    # state operands: three stages do not fit its shared memory)
    bf16, f32 = tl.bfloat16, tl.float32
    cfg = WalkConfig(tma=True)
    assert pipeline_stages(cfg, True, cfg.wide_bv, bf16) == cfg.wide_stages == 3
    assert pipeline_stages(cfg, True, cfg.fold_bv, bf16) == cfg.stages == 2
    assert pipeline_stages(cfg, False, cfg.wide_bv, bf16) == 2
    assert pipeline_stages(cfg, True, cfg.wide_bv, f32) == 2


@pytest.mark.parametrize(
    ("B", "T", "packed", "aligned", "shape", "factors"),
    [
        (4, 8192, 0, True, (128, 8, 3), True),  # B4: unsplit, one wave of 128 whole-V programs
        (1, 32768, 0, True, (128, 8, 3), True),  # B1: 4 segments, 128 programs
        (1, 32768, 8, True, (128, 8, 3), True),  # 8 packed × 4096: 256 programs
        (1, 512, 0, True, (32, 4, 2), False),  # B1 T512: unsplit, 32 chains x 4 blocks, 8 chunks
        (2, 1024, 0, True, (128, 8, 3), True),  # B2 T1024: 2 segments of 8 chunks each
        (4, 8192, 0, False, (64, 4, 2), False),  # rows not 16-byte aligned: masked loads, 64-wide
    ],
    ids=["B4-T8192", "B1-T32768", "packed-8x4096", "B1-T512", "B2-T1024", "B4-T8192-unaligned"],
)
def test_the_walk_launches_at_its_shape_on_an_h100(
    B: int,
    T: int,
    packed: int,
    aligned: bool,
    shape: tuple[int, int, int],
    factors: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `run_split` launches at the Qwen3.5 heads on an H100 (132 SMs, TMA), bf16 with the
    compiled kernels' dot policy (16-bit state operands; the interpreter's is float32): the walk's
    V block, warps and stages (launches captured, not run).  Whole-V at three stages wherever
    the tiles come by TMA (`wide_tiles`) and the chains fill a wave, 32-wide at two for B1 T512's
    32 chains, 64-wide at two where the tiles cannot come by TMA (a K of 100: rows not 16-byte
    aligned).  k's and w's factors loaded only by B1 T512's short narrow walk (`tma_factors`)."""
    walks: list[dict[str, object]] = []

    def capture(
        rec: object, kernel: object, grid: object, args: object, kw: dict[str, object], **_: object
    ) -> None:
        if kernel is ds._segment_output_kernel:
            walks.append(kw)

    compiled = dot_policy(torch.bfloat16, object())  # a plain object: not interpreted
    monkeypatch.setattr(dp, "dot_policy", lambda dtype, kernel, tc=True: compiled)
    monkeypatch.setattr(ds, "sm_count", lambda device: 132)
    monkeypatch.setattr(ds, "plain_launch", capture)
    monkeypatch.setattr(dp, "plain_launch", capture)
    K = QWEN["K"] if aligned else 100
    q = torch.zeros(B, T, QWEN["H"], K, dtype=torch.bfloat16)
    v = torch.zeros(B, T, QWEN["HV"], QWEN["V"], dtype=torch.bfloat16)
    g = torch.zeros(B, T, QWEN["HV"])
    cu = torch.arange(0, T + 1, T // packed, dtype=torch.int32) if packed else None
    N = packed or B
    ds.run_split(q, q, v, g, g, (T, QWEN["H"], QWEN["HV"], K, QWEN["V"], N), 1.0, None, False, cu, True)
    (walk,) = walks
    assert walk["STATE_DT"] == tl.bfloat16
    assert walk["TMA"] == aligned
    assert walk["TMA_FACTORS"] == factors
    assert (walk["BV"], walk["num_warps"], walk["num_stages"]) == shape


def test_walk_config_takes_tma_from_sm90() -> None:
    """TMA where the GPU has it (compute capability 9), and under the interpreter, which stands
    in for one on the CPU."""
    assert walk_config(torch.device("cpu")).tma
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        assert walk_config(device).tma == (torch.cuda.get_device_capability(device)[0] >= 9)


def test_default_path_takes_the_split_design_only_where_it_was_measured_faster() -> None:
    bf16, f16 = torch.bfloat16, torch.float16
    assert takes_default_path(bf16, True, 4, 32, 128, 128)  # B4 T8192, 8 packed sequences
    assert takes_default_path(bf16, True, 1, 32, 128, 128, 2048)  # B1 T2048: split, warm-ups
    assert takes_default_path(bf16, True, 1, 32, 128, 128, 1024)  # B1 T1024: split, warm-ups
    assert takes_default_path(bf16, True, 1, 32, 128, 128, 512)  # B1 T512: split, unsplit
    assert not takes_default_path(bf16, True, 1, 32, 128, 128, 511)  # shorter: three launches
    assert not takes_default_path(bf16, True, 1, 32, 128, 128, 256)
    assert not takes_default_path(bf16, True, 2, 32, 128, 128, 1023)  # two sequences, 511 tokens each
    assert takes_default_path(bf16, True, 2, 32, 128, 128, 1024)  # B2 T512 (2 x 512 tokens in all)
    assert takes_default_path(bf16, True, 1, 32, 128, 128, 32768)  # B1 T32768: split, warm-ups
    assert not takes_default_path(f16, True, 1, 32, 128, 128, 32768)
    assert not takes_default_path(f16, True, 8, 32, 128, 128)  # f16 would spill
    assert not takes_default_path(bf16, False, 8, 32, 128, 128)  # FMA path (sm70)
    assert not takes_default_path(bf16, True, 8, 32, 256, 128)  # wider than one tile


@pytest.mark.gpu
@pytest.mark.parametrize("segments", [1, 3, None])
@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
@pytest.mark.parametrize(
    "shape",
    [dict(B=1, T=4096), dict(B=1, T=700), dict(B=4, T=1000), dict(lens=[1, 63, 64, 65, 1000, 3000])],
    ids=["B1-T4096", "B1-T700", "B4-T1000", "varlen-6"],
)
def test_split_matches_reference_gpu(
    shape: dict[str, object],
    dtype_name: str,
    segments: int | None,
    rng: torch.Generator,
    gpu_device: torch.device,
) -> None:
    kw = dict(initial=True, **shape, **QWEN)
    check_against_reference(rng, gpu_device, dtype_name, op=split_op(segments), **kw)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("factors", [True, False], ids=["factors-by-tma", "factors-loaded"])
@pytest.mark.parametrize("layout", ["varlen", "dense", "dense-aligned"])
def test_tma_tiles_give_the_masked_loads_results_gpu(
    layout: str, factors: bool, rng: torch.Generator, gpu_device: torch.device
) -> None:
    """`test_tma_tiles_give_the_masked_loads_results` at the Qwen3.5 heads on the GPU (the same
    dots and roundings: equal up to the order the compiler gives a sum, measured bit-identical on
    the H200)."""
    (o1, h1), (o0, h0) = tma_and_masked(rng, gpu_device, layout, factors=factors, **QWEN)
    torch.testing.assert_close(o1, o0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h1, h0, rtol=1e-6, atol=1e-6)
