"""`fused_recurrent_gated_delta_rule` (Triton, decode) against the float64 token-by-token
reference: outputs and the whole state pool after the in-place update.

CPU tier: small K/V (plus one case at the real K = V = 128) under ``TRITON_INTERPRET=1``.
GPU tier (``-m gpu``): the real layer shapes (H=16, HV=32, K=V=128) at serving batch sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
from devices import where_values_are_checked

from clef_runtime.compare import assert_close
from clef_runtime.dtypes import NAMES, torch_dtype
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops.delta_rule_recurrent import fused_recurrent_gated_delta_rule
from clef_runtime.opset import get_opset
from clef_runtime.reference import delta_rule as ref
from clef_runtime.tolerances import tolerance

OP = "fused_recurrent_gated_delta_rule"


def state_pool(
    rng: torch.Generator, device: torch.device, pool: int, HV: int, K: int, V: int
) -> torch.Tensor:
    """States of the magnitude a prefill of unit-norm keys and unit-scale values leaves."""
    return (0.3 * torch.randn(pool, HV, K, V, generator=rng)).to(device)


def check_against_reference(
    rng: torch.Generator,
    device: torch.device,
    dtype_name: str,
    *,
    B: int,
    T: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    pool: int | None = None,
    indices: list[int] | None = None,
    l2norm: bool = True,
    scale: float | None = None,
) -> None:
    dtype = torch_dtype(dtype_name)
    q, k, v, g, beta = gdn_inputs(rng, device, dtype, B=B, T=T, H=H, HV=HV, K=K, V=V, normalise_qk=not l2norm)
    state = state_pool(rng, device, pool or B, HV, K, V)
    idx = None if indices is None else torch.tensor(indices, dtype=torch.int32, device=device)
    ref_state = state.clone()
    kw = dict(scale=scale, state_indices=idx, use_qk_l2norm=l2norm)
    o = fused_recurrent_gated_delta_rule(q, k, v, g, beta, state=state, **kw)  # type: ignore[arg-type]
    ro = ref.fused_recurrent_gated_delta_rule(q, k, v, g, beta, state=ref_state, **kw)  # type: ignore[arg-type]
    tol = tolerance(OP, dtype_name)
    assert o.dtype == v.dtype and o.shape == (B, T, HV, V)
    assert_close(o, ro, tol, f"{OP} {dtype_name} output")
    assert_close(state, ref_state, tol, f"{OP} {dtype_name} state pool")
    for row, slot in enumerate(indices or []):
        if slot < 0:
            assert torch.count_nonzero(o[row]) == 0, "a padding row must output zeros"
    live = set(indices if indices is not None else range(B))
    for slot in range(state.shape[0]):
        if slot not in live:
            assert torch.equal(state[slot], ref_state[slot]), (
                f"slot {slot} is not in state_indices but changed"
            )


CASES: dict[str, dict[str, object]] = {
    "B3-T1-pool5-indices-padding": dict(B=3, T=1, H=2, HV=4, K=32, V=32, pool=5, indices=[4, -1, 0]),
    "B2-T3-grouped2-odd-V": dict(B=2, T=3, H=1, HV=2, K=16, V=24),
    "B2-T2-prenormalised-scale": dict(B=2, T=2, H=1, HV=1, K=16, V=16, l2norm=False, scale=0.5),
    "real-dims-K128-V128": dict(B=2, T=2, H=1, HV=2, K=128, V=128, pool=3, indices=[2, 0]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case: str, dtype_name: str, rng: torch.Generator, device: torch.device) -> None:
    check_against_reference(rng, device, dtype_name, **CASES[case])  # type: ignore[arg-type]


# --- input validation ---------------------------------------------------------------------------


def _valid(device: torch.device) -> dict[str, object]:
    B, T, H, HV, K, V = 2, 1, 2, 2, 16, 16
    return dict(
        q=torch.zeros(B, T, H, K, device=device),
        k=torch.zeros(B, T, H, K, device=device),
        v=torch.zeros(B, T, HV, V, device=device),
        g=torch.zeros(B, T, HV, device=device),
        beta=torch.zeros(B, T, HV, device=device),
        state=torch.zeros(B, HV, K, V, device=device),
    )


BAD_INPUTS: dict[str, tuple[dict[str, object], str]] = {
    "state-f16": (dict(state=torch.zeros(2, 2, 16, 16, dtype=torch.float16)), r"state must be float32"),
    "state-shape": (
        dict(state=torch.zeros(2, 2, 16, 8)),
        r"state must be float32 \[pool, HV=2, K=16, V=16\]",
    ),
    "state-strided": (dict(state=torch.zeros(2, 2, 16, 32)[..., :16]), r"state must be contiguous"),
    "pool-too-small": (dict(state=torch.zeros(1, 2, 16, 16)), r"state has 1 slots for B=2"),
    "indices-int64": (dict(state_indices=torch.tensor([0, 1])), r"state_indices has dtype"),
    "indices-shape": (
        dict(state_indices=torch.tensor([0], dtype=torch.int32)),
        r"state_indices has 1 entries",
    ),
    "indices-past-pool": (
        dict(state_indices=torch.tensor([0, 2], dtype=torch.int32)),
        r"slot 2 but the state pool",
    ),
    "indices-duplicate": (dict(state_indices=torch.tensor([1, 1], dtype=torch.int32)), r"name a slot twice"),
    "heads-not-multiple": (dict(v=torch.zeros(2, 1, 3, 16)), r"HV=3 must be a positive multiple"),
}


@pytest.mark.parametrize(
    "case", where_values_are_checked(BAD_INPUTS, {"indices-past-pool", "indices-duplicate"})
)
def test_rejects_bad_inputs(case: str, device: torch.device) -> None:
    changes, message = BAD_INPUTS[case]
    args = _valid(device)
    args.update({name: t.to(device) for name, t in changes.items() if isinstance(t, torch.Tensor)})
    with pytest.raises((ValueError, TypeError), match=message):
        fused_recurrent_gated_delta_rule(**args)  # type: ignore[arg-type]


# --- the fp16_state_overflow fault --------------------------------------------------------------


# the interpreter (numpy) warns about the overflow the fault exists to produce
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_fp16_state_overflow_fault(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    """Decode after a long, legitimate prefill whose state left f16's range.

    The prefill is the one of test_ops_delta_rule_chunk's fault test (Hadamard keys, values
    16384, β = 0.99, g ≈ 0), run by the reference: its float32 state has row 0 ≈ 92,000 >
    65,504 and outputs ≈ 2,900.  The next token continues the pattern.  Held in f16, the state
    is inf from the moment it is loaded, so the output is non-finite on every run; in float32
    it matches the reference."""
    K, V, T = 32, 16, 129
    Hd = torch.ones(1, 1)
    while Hd.shape[0] < K:
        Hd = torch.cat([torch.cat([Hd, Hd], 1), torch.cat([Hd, -Hd], 1)], 0)
    keys = (Hd / math.sqrt(K))[torch.arange(T) % K].view(1, T, 1, K).to(torch.float16)
    v = torch.full((1, T, 1, V), 16384.0, dtype=torch.float16)
    g = torch.full((1, T, 1), -1e-3)
    beta = torch.full((1, T, 1), 0.99)
    _, prefill_state = ref.chunk_gated_delta_rule(
        keys[:, :-1], keys[:, :-1], v[:, :-1], g[:, :-1], beta[:, :-1], output_final_state=True
    )
    assert prefill_state is not None and float(prefill_state.abs().max()) > 65504
    step = [t[:, -1:].to(device) for t in (keys, keys, v, g, beta)]

    ref_state = prefill_state.to(device)
    ro = ref.fused_recurrent_gated_delta_rule(*step, state=ref_state)
    assert float(ro.abs().max()) < 65504

    state = prefill_state.to(device)
    o = fused_recurrent_gated_delta_rule(*step, state=state)
    assert_close(o, ro, tolerance(OP, "f16"), "fault-free output")
    assert_close(state, ref_state, tolerance(OP, "f16"), "fault-free state")

    monkeypatch.setenv("CLEF_RUNTIME_FAULT", "fp16_state_overflow")
    state = prefill_state.to(device)
    bad = get_opset("triton").fused_recurrent_gated_delta_rule(*step, state=state)
    assert not torch.isfinite(bad).all()
    assert not torch.isfinite(state).all()


# --- GPU tier: the real Qwen3.5 GDN shapes ------------------------------------------------------

QWEN = dict(H=16, HV=32, K=128, V=128)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", list(NAMES))
@pytest.mark.parametrize(
    "shape",
    [
        dict(B=1, T=1),
        dict(B=4, T=3),
        dict(B=64, T=1, pool=100, indices=[(7 * i) % 100 if i % 9 else -1 for i in range(64)]),
    ],
    ids=["B1-T1", "B4-T3", "B64-T1-pool100-padding"],
)
def test_matches_reference_gpu(
    dtype_name: str, shape: dict[str, object], rng: torch.Generator, gpu_device: torch.device
) -> None:
    check_against_reference(rng, gpu_device, dtype_name, **shape, **QWEN)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_fp16_state_overflow_fault_gpu(monkeypatch: pytest.MonkeyPatch, gpu_device: torch.device) -> None:
    test_fp16_state_overflow_fault(monkeypatch, gpu_device)
