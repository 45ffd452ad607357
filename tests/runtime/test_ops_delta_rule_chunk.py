"""`chunk_gated_delta_rule` (Triton, chunked WY prefill) against the float64 token-by-token
reference, on seeded inputs with the statistics of a Qwen3.5 GDN layer.

CPU tier: small K/V (plus one case at the real K = V = 128) under ``TRITON_INTERPRET=1``.
GPU tier (``-m gpu``): the real layer shapes (H=16, HV=32, K=V=128) up to T=4096 per sequence.
Both tiers run f16 under both launch configurations (``dtype_config``): the tensor-core one and
the FMA one of the homelab's V100 (FMA tiles, row-by-row solve), forced through the op set.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import triton.language as tl
from devices import where_values_are_checked

from clef_runtime.compare import assert_close
from clef_runtime.dtypes import torch_dtype
from clef_runtime.faults import UnknownFaultError
from clef_runtime.inputs import gdn_inputs
from clef_runtime.kernel_config import UnknownKernelConfigError
from clef_runtime.ops import delta_rule_prepare as dp
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule
from clef_runtime.ops.delta_rule_config import launch_config
from clef_runtime.opset import get_opset
from clef_runtime.reference import delta_rule as ref
from clef_runtime.tolerances import tolerance

OP = "chunk_gated_delta_rule"


def packed_cu_seqlens(lens: list[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def chunk_op(kernel_config: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The Triton op with the launch configuration forced (``auto``: the device decides)."""
    return get_opset("triton", kernel_config=kernel_config).chunk_gated_delta_rule


def check_against_reference(
    rng: torch.Generator,
    device: torch.device,
    dtype_name: str,
    *,
    kernel_config: str = "auto",
    B: int = 1,
    T: int = 0,
    lens: list[int] | None = None,
    H: int,
    HV: int,
    K: int,
    V: int,
    l2norm: bool = True,
    initial: bool = False,
    final: bool = True,
    scale: float | None = None,
    op: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None = None,
) -> None:
    """``op``: the implementation under test (default: the op set's, `kernel_config` forced)."""
    dtype = torch_dtype(dtype_name)
    cu = None
    if lens is not None:
        B, T = 1, sum(lens)
        cu = packed_cu_seqlens(lens, device)
    N = B if lens is None else len(lens)
    q, k, v, g, beta = gdn_inputs(rng, device, dtype, B=B, T=T, H=H, HV=HV, K=K, V=V, normalise_qk=not l2norm)
    h0 = 0.1 * torch.randn(N, HV, K, V, generator=rng).to(device) if initial else None
    kw = dict(scale=scale, initial_state=h0, output_final_state=final, cu_seqlens=cu, use_qk_l2norm=l2norm)
    o, ht = (op or chunk_op(kernel_config))(q, k, v, g, beta, **kw)
    ro, rht = ref.chunk_gated_delta_rule(q, k, v, g, beta, **kw)  # type: ignore[arg-type]
    tol = tolerance(OP, dtype_name)
    assert o.dtype == v.dtype and o.shape == (B, T, HV, V)
    assert_close(o, ro, tol, f"{OP} {dtype_name} output")
    if final:
        assert ht is not None and rht is not None
        assert ht.dtype == torch.float32 and ht.shape == (N, HV, K, V)
        assert_close(ht, rht, tol, f"{OP} {dtype_name} final state")
    else:
        assert ht is None


# Shapes chosen to cross chunk boundaries at awkward places (T = 65, 200 = 3·64 + 8), to mask
# head dims that are not powers of two, and to group value heads (HV / H = 2, 4).
CASES: dict[str, dict[str, object]] = {
    "B2-T65-grouped2-h0": dict(B=2, T=65, H=1, HV=2, K=32, V=16, initial=True),
    "B1-T200-grouped2-scale-prenormalised": dict(B=1, T=200, H=2, HV=4, K=16, V=32, scale=0.3, l2norm=False),
    "varlen-1-3-0-63-65-h0": dict(lens=[1, 3, 0, 63, 65], H=2, HV=2, K=32, V=32, initial=True),
    "varlen-10-with-empties": dict(
        lens=[5, 0, 64, 1, 128, 7, 65, 0, 0, 3], H=1, HV=1, K=16, V=16, initial=True
    ),
    "B3-T1-h0": dict(B=3, T=1, H=1, HV=1, K=16, V=16, initial=True),
    "B1-T3-grouped4-no-final": dict(B=1, T=3, H=1, HV=4, K=16, V=16, final=False),
    "odd-dims-K20-V24-T70": dict(B=1, T=70, H=1, HV=1, K=20, V=24, initial=True),
    "real-dims-K128-V128-T70": dict(B=1, T=70, H=1, HV=2, K=128, V=128, initial=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(
    case: str, dtype_config: tuple[str, str], rng: torch.Generator, device: torch.device
) -> None:
    dtype_name, config = dtype_config
    check_against_reference(rng, device, dtype_name, kernel_config=config, **CASES[case])  # type: ignore[arg-type]


def test_repeated_keys_full_beta_no_decay(
    dtype_config: tuple[str, str], rng: torch.Generator, device: torch.device
) -> None:
    """The worst case for the in-chunk triangular solve: every key the same, β = 1, g = 0, so
    every entry of A below the diagonal is 1 and T = (I + A)⁻¹ is bidiagonal (1, -1), while the
    powers of A's blocks grow like binomial coefficients (a power series would cancel them
    catastrophically).  Keys in two groups, with a little noise, so the chunk is not all alike."""
    dtype_name, config = dtype_config
    dtype = torch_dtype(dtype_name)
    B, T, H, HV, K, V = 1, 130, 1, 2, 32, 16
    base = torch.randn(2, K, generator=rng)
    which = (torch.arange(T) // 40) % 2  # runs of 40 equal-ish keys, crossing 16- and 64-blocks
    k = base[which] + 1e-3 * torch.randn(T, K, generator=rng)
    q = torch.randn(B, T, H, K, generator=rng)
    k = k.reshape(B, T, H, K)
    v = torch.randn(B, T, HV, V, generator=rng)
    g = torch.zeros(B, T, HV)
    beta = torch.ones(B, T, HV)
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    g, beta = g.to(device), beta.to(device)
    kw = dict(output_final_state=True, use_qk_l2norm=True)
    o, ht = chunk_op(config)(q, k, v, g, beta, **kw)
    ro, rht = ref.chunk_gated_delta_rule(q, k, v, g, beta, **kw)  # type: ignore[arg-type]
    tol = tolerance(OP, dtype_name)
    assert_close(o, ro, tol, f"{OP} {dtype_name} output, repeated keys")
    assert ht is not None and rht is not None
    assert_close(ht, rht, tol, f"{OP} {dtype_name} final state, repeated keys")


def test_solve_takes_f16_operands_for_bf16_on_tensor_cores_only() -> None:
    """Launch 1's solve dots: f16 operands for bf16 inputs on tensor cores (measured faster on
    the H200, errors no larger: `delta_rule_config.launch_config`), float32 everywhere else."""

    def solve_dt(dtype: torch.dtype, tc: bool) -> object:
        return launch_config(128, 128, dtype, tc).solve_dt

    assert solve_dt(torch.bfloat16, True) == tl.float16
    assert solve_dt(torch.float16, True) == tl.float32, "f16 inputs keep T's 11 bits"
    assert solve_dt(torch.bfloat16, False) == tl.float32, "the FMA path keeps IEEE float32"
    assert solve_dt(torch.float32, False) == tl.float32


@pytest.mark.parametrize(
    ("dtype", "K", "line", "lines"),
    [
        (torch.bfloat16, 128, 64, 2),
        (torch.bfloat16, 100, 64, 2),
        (torch.bfloat16, 32, 64, 1),
        (torch.float32, 128, 32, 4),
    ],
)
def test_compiled_launch_1_prefetches_whole_rows(
    dtype: torch.dtype, K: int, line: int, lines: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled, launch 1 asks L2 for the rows of the chunk `PREFETCH_AHEAD` slots on: a row's
    K elements in 128-byte lines of LINE elements, LINES of them (a power of two covering the
    row); interpreted, it asks for none (inline PTX does not run there).  Launches captured, not
    run; the speed this buys is measured by the bench (docs/performance.md)."""
    launches: list[dict[str, object]] = []

    def capture(
        rec: object, kernel: object, grid: object, args: object, kw: dict[str, object], **_: object
    ) -> None:
        launches.append(kw)

    monkeypatch.setattr(dp, "plain_launch", capture)
    q = torch.zeros(1, 128, 2, K, dtype=dtype)
    v = torch.zeros(1, 128, 4, 64, dtype=dtype)
    g = torch.zeros(1, 128, 4)
    # keys it does not normalise, 8 programs on the CPU's one "SM": more than a wave
    args = (q, q, v, g, g, 1, 1.0, None, False, False, dtype != torch.float32)
    dp.prepare(*args)
    monkeypatch.setattr(dp, "interpreted", lambda kernel: False)
    dp.prepare(*args)
    interp, compiled = launches
    assert interp["PREFETCH"] is False
    assert compiled["PREFETCH"] is True
    assert (compiled["AHEAD"], compiled["LINE"], compiled["LINES"]) == (dp.PREFETCH_AHEAD, line, lines)
    assert line * lines >= K > line * (lines // 2)


def test_launch_1_prefetches_only_past_one_wave_of_packed_or_unnormalised_rows() -> None:
    """`prefetches`: the split design's launch 1 never within one wave of its programs (65,536
    registers an SM over its 128-register cap × 4 warps: 4 programs an SM), and past it for packed
    sequences and for keys it does not normalise, not for dense rows it normalises (each choice
    measured, docs/performance.md).  Without a register cap the programs an SM are unknown and it
    prefetches; the three-launch design's launch 1, not measured against this, always does."""
    bf16 = launch_config(128, 128, torch.bfloat16, True)
    assert (bf16.regs1_t, bf16.warps1) == (128, 4)
    sms = 132
    wave = 4 * sms
    for varlen, l2norm in itertools.product((False, True), repeat=2):
        case = (varlen, l2norm)
        assert not dp.prefetches(wave, bf16, True, sms, varlen, l2norm), case
        assert dp.prefetches(wave + 1, bf16, True, sms, varlen, l2norm) is (varlen or not l2norm), case
        assert dp.prefetches(1, bf16, False, sms, varlen, l2norm), case
    f32 = launch_config(128, 128, torch.float32, True)
    assert f32.regs1_t is None
    assert dp.prefetches(1, f32, True, sms, False, True)


def test_final_state_flag_does_not_change_output(rng: torch.Generator, device: torch.device) -> None:
    q, k, v, g, beta = gdn_inputs(rng, device, torch.float32, B=1, T=70, H=1, HV=2, K=16, V=16)
    o1, h1 = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, output_final_state=True)
    o2, h2 = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    assert h1 is not None and h2 is None
    assert torch.equal(o1, o2)


def test_strided_qkv_views(rng: torch.Generator, device: torch.device) -> None:
    """q/k/v as views into one packed projection output [B, T, (2H·K + HV·V)] (token stride ≠
    head block size), as the conv produces them: same result as contiguous copies."""
    B, T, H, HV, K, V = 2, 70, 1, 2, 16, 16
    x = torch.randn(B, T, 2 * H * K + HV * V, generator=rng).to(device)
    q = x[..., : H * K].view(B, T, H, K)
    k = x[..., H * K : 2 * H * K].view(B, T, H, K)
    v = x[..., 2 * H * K :].view(B, T, HV, V)
    assert not q.is_contiguous()
    _, _, _, g, beta = gdn_inputs(rng, device, torch.float32, B=B, T=T, H=H, HV=HV, K=K, V=V)
    o1, h1 = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, output_final_state=True)
    o2, h2 = chunk_gated_delta_rule(
        q.contiguous(), k.contiguous(), v.contiguous(), g, beta, use_qk_l2norm=True, output_final_state=True
    )
    assert h1 is not None and h2 is not None
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


# --- input validation ---------------------------------------------------------------------------


def _valid(device: torch.device) -> dict[str, object]:
    B, T, H, HV, K, V = 1, 4, 2, 4, 16, 16
    return dict(
        q=torch.zeros(B, T, H, K, device=device),
        k=torch.zeros(B, T, H, K, device=device),
        v=torch.zeros(B, T, HV, V, device=device),
        g=torch.zeros(B, T, HV, device=device),
        beta=torch.zeros(B, T, HV, device=device),
    )


BAD_INPUTS: dict[str, tuple[dict[str, object], str]] = {
    "q-3d": (dict(q=torch.zeros(1, 4, 32)), r"q must be \[B, T, H, K\]"),
    "k-shape": (dict(k=torch.zeros(1, 4, 2, 8)), r"k must have q's shape"),
    "v-T": (dict(v=torch.zeros(1, 5, 4, 16)), r"v must be \[B, T, HV, V\]"),
    "heads-not-multiple": (
        dict(v=torch.zeros(1, 4, 3, 16)),
        r"HV=3 must be a positive multiple of key heads H=2",
    ),
    "K-too-large": (
        dict(q=torch.zeros(1, 4, 2, 512), k=torch.zeros(1, 4, 2, 512)),
        r"head dim K=512 is outside 1\.\.256",
    ),
    "int-dtype": (
        dict(q=torch.zeros(1, 4, 2, 16, dtype=torch.int32), k=torch.zeros(1, 4, 2, 16, dtype=torch.int32)),
        r"q dtype torch.int32 is not supported",
    ),
    "mixed-dtype": (dict(v=torch.zeros(1, 4, 4, 16, dtype=torch.float16)), r"v is torch.float16 but q is"),
    "g-bf16": (dict(g=torch.zeros(1, 4, 4, dtype=torch.bfloat16)), r"g must be float32.*g\.float\(\)"),
    "beta-shape": (dict(beta=torch.zeros(1, 4, 2)), r"beta must be \[B, T, HV\]"),
    "q-transposed": (
        dict(q=torch.zeros(1, 4, 16, 2).transpose(2, 3)),
        r"q must have its last two dims contiguous.*q\.contiguous\(\)",
    ),
    "initial-state-shape": (
        dict(initial_state=torch.zeros(1, 4, 16, 8)),
        r"initial_state must be float32 \[1,",
    ),
    "initial-state-dtype": (
        dict(initial_state=torch.zeros(1, 4, 16, 16, dtype=torch.float16)),
        r"initial_state must be float32",
    ),
    "cu-seqlens-batch": (
        dict(
            q=torch.zeros(2, 4, 2, 16),
            k=torch.zeros(2, 4, 2, 16),
            v=torch.zeros(2, 4, 4, 16),
            g=torch.zeros(2, 4, 4),
            beta=torch.zeros(2, 4, 4),
            cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32),
        ),
        r"cu_seqlens packs sequences into a batch of 1",
    ),
    "cu-seqlens-end": (dict(cu_seqlens=torch.tensor([0, 2, 3], dtype=torch.int32)), r"end at T=4"),
}


@pytest.mark.parametrize("case", where_values_are_checked(BAD_INPUTS, {"cu-seqlens-end"}))
def test_rejects_bad_inputs(case: str, device: torch.device) -> None:
    changes, message = BAD_INPUTS[case]
    args = _valid(device)
    args.update({name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in changes.items()})
    with pytest.raises((ValueError, TypeError), match=message):
        chunk_gated_delta_rule(**args)  # type: ignore[arg-type]


# --- the fp16_state_overflow fault --------------------------------------------------------------


def hadamard_prefill_inputs(
    device: torch.device, T: int = 128, K: int = 32, V: int = 16
) -> tuple[torch.Tensor, ...]:
    """A legitimate f16 input whose float32 state leaves f16's range, deterministically.

    Keys run through the rows of a normalised Sylvester–Hadamard matrix (orthonormal, so with
    β ≈ 1 each write survives intact and the writes add up), values are a constant 16384 (an
    ordinary f16 value), queries equal the keys, g ≈ 0 (a long-memory head).  The state then
    converges to ``S ≈ √K · 16384 · e_0 1ᵀ``: row 0 (every Hadamard row has +1 in column 0)
    holds ≈ 92,000 > 65,504 after the first chunk, while each output ``Sᵀq·scale`` is
    ≈ 16384 · scale ≈ 2,900, well inside f16.  No randomness is involved: a state held in f16
    overflows to inf at the first chunk boundary on every run, and the next chunk reads it."""
    Hd = torch.ones(1, 1)
    while Hd.shape[0] < K:
        Hd = torch.cat([torch.cat([Hd, Hd], 1), torch.cat([Hd, -Hd], 1)], 0)
    keys = (Hd / math.sqrt(K))[torch.arange(T) % K]
    q = keys.view(1, T, 1, K).to(torch.float16)
    k = q.clone()
    v = torch.full((1, T, 1, V), 16384.0, dtype=torch.float16)
    g = torch.full((1, T, 1), -1e-3)
    beta = torch.full((1, T, 1), 0.99)
    return tuple(t.to(device) for t in (q, k, v, g, beta))


# the interpreter (numpy) warns about the overflow the fault exists to produce
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_fp16_state_overflow_fault(
    monkeypatch: pytest.MonkeyPatch, device: torch.device, f16_kernel_config: str
) -> None:
    q, k, v, g, beta = hadamard_prefill_inputs(device)
    ro, rht = ref.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert rht is not None
    assert float(rht.abs().max()) > 65504 > float(ro.abs().max())  # the premise: legit, but not f16

    o, ht = chunk_op(f16_kernel_config)(q, k, v, g, beta, output_final_state=True)
    assert ht is not None
    assert_close(o, ro, tolerance(OP, "f16"), "fault-free output")
    assert_close(ht, rht, tolerance(OP, "f16"), "fault-free final state")

    monkeypatch.setenv("CLEF_RUNTIME_FAULT", "fp16_state_overflow")
    bad, bad_state = chunk_op(f16_kernel_config)(q, k, v, g, beta, output_final_state=True)
    assert bad_state is not None
    assert torch.isfinite(bad[:, :64]).all()  # the first chunk never reads a stored state
    assert not torch.isfinite(bad[:, 64:]).all()
    assert not torch.isfinite(bad_state).all()


def test_other_faults_leave_it_alone(
    monkeypatch: pytest.MonkeyPatch, rng: torch.Generator, device: torch.device
) -> None:
    q, k, v, g, beta = gdn_inputs(rng, device, torch.float16, B=1, T=70, H=1, HV=1, K=16, V=16)
    clean, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    monkeypatch.setenv("CLEF_RUNTIME_FAULT", "conv_key_band_zero")
    faulty = get_opset("triton", qkv_split=(16, 16, 16))
    other, _ = faulty.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    assert torch.equal(clean, other)


def test_unknown_fault_name_raises(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    monkeypatch.setenv("CLEF_RUNTIME_FAULT", "fp16_state_overfloww")
    with pytest.raises(UnknownFaultError, match="not in the fault catalogue"):
        get_opset("triton").chunk_gated_delta_rule(**_valid(device))


# --- GPU tier: the real Qwen3.5 GDN shapes ------------------------------------------------------

QWEN = dict(H=16, HV=32, K=128, V=128)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape",
    [dict(B=1, T=4096), dict(B=4, T=1000), dict(B=2, T=64), dict(lens=[1, 63, 64, 65, 1000, 3000])],
    ids=["B1-T4096", "B4-T1000", "B2-T64", "varlen-6"],
)
def test_matches_reference_gpu(
    dtype_config: tuple[str, str], shape: dict[str, object], rng: torch.Generator, gpu_device: torch.device
) -> None:
    dtype_name, config = dtype_config
    kw = dict(kernel_config=config, initial=True, **shape, **QWEN)
    check_against_reference(rng, gpu_device, dtype_name, **kw)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_fp16_state_overflow_fault_gpu(
    monkeypatch: pytest.MonkeyPatch, gpu_device: torch.device, f16_kernel_config: str
) -> None:
    test_fp16_state_overflow_fault(monkeypatch, gpu_device, f16_kernel_config)


@pytest.mark.gpu
@pytest.mark.parametrize(("K", "V"), [(16, 16), (32, 16), (16, 32), (24, 40)])
def test_small_head_dims_gpu(
    dtype_config: tuple[str, str], K: int, V: int, rng: torch.Generator, gpu_device: torch.device
) -> None:
    """Head dims below the 32-wide tensor-core tiles: on an H200 (Triton 3.6) 16-wide dot tiles
    gave wrong sums in f16/bf16 (found by bench/probe_chunk.py); the wrapper pads them.  The
    FMA configuration keeps 16-wide tiles: f16-fma runs them for real."""
    dtype_name, config = dtype_config
    kw = dict(kernel_config=config, B=2, T=200, H=2, HV=4, K=K, V=V)
    check_against_reference(rng, gpu_device, dtype_name, **kw)  # type: ignore[arg-type]


# --- the launch configuration, forced ---------------------------------------------------------


def test_forced_configuration_reaches_the_kernels(rng: torch.Generator, device: torch.device) -> None:
    """``fma`` and ``tensor-core`` launch different tiles and solves: the same f16 inputs give
    different float32 final states (both within tolerance, see `test_matches_reference`)."""
    x = gdn_inputs(rng, device, torch.float16, B=1, T=130, H=1, HV=1, K=64, V=64)
    _, fma = chunk_op("fma")(*x, use_qk_l2norm=True, output_final_state=True)
    _, tc = chunk_op("tensor-core")(*x, use_qk_l2norm=True, output_final_state=True)
    assert fma is not None and tc is not None
    assert not torch.equal(fma, tc)


def test_forcing_touches_only_the_chunked_delta_rule() -> None:
    """The other ops launch the same way on every GPU: forcing leaves them the healthy kernels."""
    from clef_runtime.ops import TRITON_OPS

    for config in ("fma", "tensor-core"):
        forced = vars(get_opset("triton", kernel_config=config))
        changed = sorted(k for k, fn in vars(TRITON_OPS).items() if forced[k] is not fn)
        assert changed == [OP], (config, changed)
    assert get_opset("triton", kernel_config="auto") is TRITON_OPS


def test_kernel_config_is_read_once_when_the_op_set_is_built(
    monkeypatch: pytest.MonkeyPatch, rng: torch.Generator, device: torch.device
) -> None:
    monkeypatch.setenv("CLEF_KERNEL_CONFIG", "fma")
    ops = get_opset("triton")
    monkeypatch.setenv("CLEF_KERNEL_CONFIG", "tensor-core")
    x = gdn_inputs(rng, device, torch.float16, B=1, T=130, H=1, HV=1, K=64, V=64)
    _, built = ops.chunk_gated_delta_rule(*x, use_qk_l2norm=True, output_final_state=True)
    _, fma = chunk_op("fma")(*x, use_qk_l2norm=True, output_final_state=True)
    assert built is not None and fma is not None and torch.equal(built, fma)


def test_unknown_kernel_config_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownKernelConfigError, match="'sm70' is not one of auto, fma, tensor-core"):
        get_opset("triton", kernel_config="sm70")
    monkeypatch.setenv("CLEF_KERNEL_CONFIG", "volta")
    with pytest.raises(UnknownKernelConfigError, match="CLEF_KERNEL_CONFIG='volta'"):
        get_opset("triton")
