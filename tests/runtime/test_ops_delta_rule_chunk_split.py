"""The split design of the chunked delta rule (`clef_runtime.ops.delta_rule_chunk_split`: the
output fused into the recurrence, sequences cut into segments joined by their affine maps)
against the float64 reference, as the three-launch design is tested.

CPU tier: small shapes under ``TRITON_INTERPRET=1``, with more segments than a sequence has
chunks (empty segments), uneven segments, varlen with empty sequences, an initial state, and
one segment (the plain fused recurrence).  GPU tier: the Qwen3.5 shapes.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tests.runtime.test_ops_delta_rule_chunk import OP, QWEN, check_against_reference

from clef_runtime.compare import assert_close
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops.delta_rule_chunk_split import (
    chunk_gated_delta_rule_split,
    default_segments,
    takes_default_path,
)
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


def test_segment_maps_carry_a_slowly_decaying_state(rng: torch.Generator, device: torch.device) -> None:
    """With the model's decays (g ≈ -0.05 per token) a segment forgets its start state within a
    few chunks, so a wrong map M would hide; here g ∈ (-0.004, 0], so most of each segment's start
    state survives it and the outputs depend on M (dropping M from the fold fails this test)."""
    B, T, H, HV, K, V = 1, 320, 1, 2, 32, 32
    q, k, v, g, beta = gdn_inputs(
        rng, device, torch.bfloat16, B=B, T=T, H=H, HV=HV, K=K, V=V, normalise_qk=False
    )
    g = -0.004 * torch.rand(B, T, HV, generator=rng).to(device)
    kw = dict(output_final_state=True, use_qk_l2norm=True)
    o, ht = chunk_gated_delta_rule_split(q, k, v, g, beta, segments=3, **kw)  # type: ignore[arg-type]
    ro, rht = ref.chunk_gated_delta_rule(q, k, v, g, beta, **kw)  # type: ignore[arg-type]
    tol = tolerance(OP, "bf16")
    assert_close(o, ro, tol, "split output, slow decay")
    assert ht is not None and rht is not None
    assert_close(ht, rht, tol, "split final state, slow decay")


def test_split_refuses_the_fma_configuration(device: torch.device) -> None:
    q = torch.zeros(1, 4, 1, 16, device=device)
    v = torch.zeros(1, 4, 1, 16, device=device)
    g = torch.zeros(1, 4, 1, device=device)
    with pytest.raises(ValueError, match="tensor cores only"):
        chunk_gated_delta_rule_split(q, q, v, g, g)


def test_default_segments() -> None:
    # B1 T32768 at the model's heads: 32 whole-V programs, 512 chunks -> 8 segments
    assert default_segments(1, 32, 128, 32768) == 8
    assert default_segments(4, 32, 128, 8192) == 1  # 128 programs: unsplit
    assert default_segments(1, 32, 128, 1024) == 1  # 16 chunks: too short to split
    assert default_segments(1, 32, 128, 2048) == 2
    assert default_segments(1, 1, 16, 1 << 20) == 16  # capped


def test_default_path_takes_the_split_design_only_where_it_was_measured_faster() -> None:
    bf16, f16 = torch.bfloat16, torch.float16
    assert takes_default_path(bf16, True, 4, 32, 128, 128)  # B4 T8192, 8 packed sequences
    assert not takes_default_path(bf16, True, 1, 32, 128, 128)  # B1: three launches
    assert not takes_default_path(f16, True, 8, 32, 128, 128)  # f16 would spill
    assert not takes_default_path(bf16, False, 8, 32, 128, 128)  # FMA path (sm70)
    assert not takes_default_path(bf16, True, 8, 32, 256, 128)  # wider than one tile


@pytest.mark.gpu
@pytest.mark.parametrize("segments", [1, 3, None])
@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
@pytest.mark.parametrize(
    "shape",
    [dict(B=1, T=4096), dict(B=4, T=1000), dict(lens=[1, 63, 64, 65, 1000, 3000])],
    ids=["B1-T4096", "B4-T1000", "varlen-6"],
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
