"""Triton causal conv1d (prefill and decode) against the float64 reference.

CPU tier: small shapes (D = 48 or 80, T up to 70, W = 4 unless stated) chosen to cross the tile
edges the kernels use under the interpreter (32 rows x 64 channels).  GPU tier: the Qwen3.5 GDN
conv (D = 8192 = [q 2048 | k 2048 | v 4096], W = 4) at prefill and decode sizes.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from devices import where_values_are_checked

from clef_runtime import compare
from clef_runtime.faults import ENV_VAR, UnknownFaultError
from clef_runtime.ops.conv import causal_conv1d
from clef_runtime.ops.conv_update import causal_conv1d_update
from clef_runtime.opset import get_opset
from clef_runtime.reference import conv as ref
from clef_runtime.tolerances import tolerance

W = 4
SPLIT_48 = (12, 12, 24)
QWEN_D = 8192
QWEN_SPLIT = (2048, 2048, 4096)


def _close(out: torch.Tensor, expected: torch.Tensor, op: str, dtype_name: str, what: str) -> None:
    compare.assert_close(out, expected, tolerance(op, dtype_name), f"{op} {what} [{dtype_name}]")


def _params(randn, D: int, W: int, dtype: torch.dtype, bias: bool = True):
    # Weights of a real depthwise conv are O(1/sqrt(W)); the scale only matters for coverage of
    # the SiLU's curved region.
    weight = randn(D, W, dtype=dtype, scale=W**-0.5)
    return weight, (randn(D, dtype=dtype, scale=0.5) if bias else None)


# --- prefill ------------------------------------------------------------------------------------

PREFILL_CASES = {
    # id: (B, T, D, bias, initial_state, activation)
    "T70-bias-init-silu": (2, 70, 48, True, True, "silu"),
    "T70-plain": (2, 70, 48, False, False, None),
    "T3-eq-W-1-init": (2, 3, 48, True, True, "silu"),
    "T2-lt-W-1-init": (3, 2, 48, False, True, None),
    "T1-noinit": (1, 1, 48, True, False, "silu"),
    "D80-T40-init": (1, 40, 80, True, True, "silu"),
}


@pytest.mark.parametrize("case", list(PREFILL_CASES))
def test_prefill_matches_reference(case: str, dtype: torch.dtype, dtype_name: str, randn) -> None:
    B, T, D, has_bias, has_init, activation = PREFILL_CASES[case]
    x = randn(B, T, D, dtype=dtype)
    weight, bias = _params(randn, D, W, dtype, has_bias)
    init = randn(B, D, W - 1, dtype=dtype) if has_init else None
    kw = dict(initial_state=init, output_final_state=True, activation=activation)

    y, final = causal_conv1d(x, weight, bias, **kw)
    y_ref, final_ref = ref.causal_conv1d(x, weight, bias, **kw)

    assert y.dtype == dtype and y.shape == (B, T, D)
    _close(y, y_ref, "causal_conv1d", dtype_name, f"{case} y")
    # The final state is a copy of inputs, no arithmetic: it must be exact.
    assert final is not None and final_ref is not None
    assert final.dtype == dtype and torch.equal(final, final_ref), f"{case}: final state differs"


@pytest.mark.parametrize("width", [2, 3])
def test_prefill_other_widths(width: int, randn) -> None:
    x = randn(2, 37, 48)
    weight, bias = _params(randn, 48, width, torch.float32)
    init = randn(2, 48, width - 1)
    kw = dict(initial_state=init, output_final_state=True)
    y, final = causal_conv1d(x, weight, bias, **kw)
    y_ref, final_ref = ref.causal_conv1d(x, weight, bias, **kw)
    _close(y, y_ref, "causal_conv1d", "f32", f"W={width}")
    assert final is not None and torch.equal(final, final_ref)


VARLEN_OFFSETS = {
    # a length-1 and a zero-length sequence, one spanning the 32-row tile edge, one > W - 1
    "mixed": [0, 1, 1, 6, 40, 41, 70],
    # zero-length sequences first and last, a long one crossing two tile edges
    "empty-ends": [0, 0, 3, 70, 70],
}


@pytest.mark.parametrize("layout", list(VARLEN_OFFSETS))
def test_prefill_packed_sequences(layout: str, dtype: torch.dtype, dtype_name: str, randn, device) -> None:
    cu = torch.tensor(VARLEN_OFFSETS[layout], dtype=torch.int32, device=device)
    N, T = len(cu) - 1, int(cu[-1])
    x = randn(1, T, 48, dtype=dtype)
    weight, bias = _params(randn, 48, W, dtype)
    init = randn(N, 48, W - 1, dtype=dtype)
    kw = dict(initial_state=init, output_final_state=True, cu_seqlens=cu)

    y, final = causal_conv1d(x, weight, bias, **kw)
    y_ref, final_ref = ref.causal_conv1d(x, weight, bias, **kw)
    _close(y, y_ref, "causal_conv1d", dtype_name, f"packed {layout}")
    assert final is not None and torch.equal(final, final_ref), f"packed {layout}: final state differs"
    # A zero-length sequence passes its initial state through unchanged.
    for n in range(N):
        if cu[n] == cu[n + 1]:
            assert torch.equal(final[n], init[n])


def test_prefill_many_packed_sequences(randn, device) -> None:
    """20 sequences (a deeper in-kernel search over the offsets), short ones and empty ones."""
    lengths = [3, 0, 1, 5, 2, 4, 0, 7, 1, 1, 6, 2, 3, 9, 0, 4, 5, 8, 2, 7]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
    x = randn(1, int(cu[-1]), 48)
    weight, bias = _params(randn, 48, W, torch.float32)
    init = randn(len(lengths), 48, W - 1)
    kw = dict(initial_state=init, output_final_state=True, cu_seqlens=cu)
    y, final = causal_conv1d(x, weight, bias, **kw)
    y_ref, final_ref = ref.causal_conv1d(x, weight, bias, **kw)
    _close(y, y_ref, "causal_conv1d", "f32", "20 packed sequences")
    assert final is not None and torch.equal(final, final_ref)


def test_prefill_packed_equals_separate_calls(randn, device) -> None:
    """Packing must not leak history between neighbours: each sequence alone gives the same."""
    cu = [0, 2, 37, 38, 70]
    x = randn(1, 70, 48)
    weight, bias = _params(randn, 48, W, torch.float32)
    y, final = causal_conv1d(
        x,
        weight,
        bias,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        output_final_state=True,
    )
    assert final is not None
    for n, (a, b) in enumerate(itertools.pairwise(cu)):
        y_n, final_n = causal_conv1d(x[:, a:b], weight, bias, output_final_state=True)
        assert final_n is not None
        _close(y[:, a:b], y_n, "causal_conv1d", "f32", f"sequence {n} alone")
        assert torch.equal(final[n], final_n[0])


@pytest.mark.parametrize("split", [(37, 33), (2, 1), (1, 30)])
def test_prefill_continues_from_final_state(
    split: tuple[int, int], dtype: torch.dtype, dtype_name: str, randn
) -> None:
    """conv(a) then conv(b, initial_state=final_a) == conv(a + b), outputs and final state."""
    ta, tb = split
    x = randn(2, ta + tb, 48, dtype=dtype)
    weight, bias = _params(randn, 48, W, dtype)
    init = randn(2, 48, W - 1, dtype=dtype)
    y_all, final_all = causal_conv1d(x, weight, bias, initial_state=init, output_final_state=True)
    y_a, final_a = causal_conv1d(x[:, :ta], weight, bias, initial_state=init, output_final_state=True)
    y_b, final_b = causal_conv1d(x[:, ta:], weight, bias, initial_state=final_a, output_final_state=True)
    _close(torch.cat([y_a, y_b], dim=1), y_all, "causal_conv1d", dtype_name, f"split {split}")
    assert final_b is not None and torch.equal(final_b, final_all)


def test_prefill_without_final_state_returns_none(randn) -> None:
    x = randn(1, 5, 48)
    weight, bias = _params(randn, 48, W, torch.float32)
    y, final = causal_conv1d(x, weight, bias)
    assert final is None and y.shape == x.shape


def test_prefill_accepts_time_strided_input(randn) -> None:
    """Only the channels must be contiguous: a time-strided view gives the same result."""
    big = randn(2, 2 * 37, 48)
    x = big[:, ::2]
    assert not x.is_contiguous()
    weight, bias = _params(randn, 48, W, torch.float32)
    y, _ = causal_conv1d(x, weight, bias)
    y_ref, _ = ref.causal_conv1d(x.contiguous(), weight, bias)
    _close(y, y_ref, "causal_conv1d", "f32", "time-strided x")


# --- decode -------------------------------------------------------------------------------------


def test_update_matches_reference_with_pool(dtype: torch.dtype, dtype_name: str, randn, device) -> None:
    """A permuted pool with a padding row: outputs, the touched slots and the untouched ones."""
    pool = randn(7, 48, W - 1, dtype=dtype)
    idx = torch.tensor([5, -1, 0, 3], dtype=torch.int32, device=device)
    x = randn(4, 1, 48, dtype=dtype)
    weight, bias = _params(randn, 48, W, dtype)
    pool_ref = pool.clone()
    before = pool.clone()

    y = causal_conv1d_update(x, pool, weight, bias, state_indices=idx)
    y_ref = ref.causal_conv1d_update(x, pool_ref, weight, bias, state_indices=idx)

    _close(y, y_ref, "causal_conv1d_update", dtype_name, "pool")
    assert torch.equal(y[1], torch.zeros_like(y[1])), "padding row must output zeros"
    assert torch.equal(pool, pool_ref), "state pool differs from the reference after the update"
    for slot in (1, 2, 4, 6):
        assert torch.equal(pool[slot], before[slot]), f"slot {slot} is not referenced but changed"


@pytest.mark.parametrize("t_new", [2, 5])
def test_update_several_new_tokens(t_new: int, randn) -> None:
    """T_new > 1 (speculative decoding); 5 > W - 1 replaces the whole state."""
    pool = randn(5, 48, W - 1)
    x = randn(3, t_new, 48)
    weight, _ = _params(randn, 48, W, torch.float32, bias=False)
    pool_ref = pool.clone()
    y = causal_conv1d_update(x, pool, weight, activation=None)
    y_ref = ref.causal_conv1d_update(x, pool_ref, weight, activation=None)
    _close(y, y_ref, "causal_conv1d_update", "f32", f"T_new={t_new}")
    assert torch.equal(pool, pool_ref)


@pytest.mark.parametrize(("D", "t_new", "width"), [(50, 1, W), (45, 6, W), (44, 3, 2), (40, 2, 8)])
def test_update_other_channel_counts_and_widths(D: int, t_new: int, width: int, randn, device) -> None:
    """Channel counts that are not a multiple of eight (two, one and four channels a thread) and
    other widths, through a permuted pool with a padding row, with a bias, and with more new
    tokens than the state holds (6 > W - 1: outputs from the token loop)."""
    pool = randn(6, D, width - 1)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    x = randn(3, t_new, D)
    weight, bias = _params(randn, D, width, torch.float32)
    pool_ref = pool.clone()
    y = causal_conv1d_update(x, pool, weight, bias, state_indices=idx)
    y_ref = ref.causal_conv1d_update(x, pool_ref, weight, bias, state_indices=idx)
    _close(y, y_ref, "causal_conv1d_update", "f32", f"D={D} T_new={t_new} W={width}")
    assert torch.equal(y[1], torch.zeros_like(y[1])), "padding row must output zeros"
    assert torch.equal(pool, pool_ref), "state pool differs from the reference after the update"


def test_update_shifts_state_in_place(randn, device) -> None:
    pool = randn(3, 48, W - 1, dtype=torch.float16)
    storage, before = pool.data_ptr(), pool.clone()
    x = randn(2, 1, 48, dtype=torch.float16)
    weight, bias = _params(randn, 48, W, torch.float16)
    causal_conv1d_update(
        x, pool, weight, bias, state_indices=torch.tensor([2, 0], dtype=torch.int32, device=device)
    )
    assert pool.data_ptr() == storage
    for row, slot in ((0, 2), (1, 0)):
        expected = torch.cat([before[slot, :, 1:], x[row, 0][:, None]], dim=1)  # oldest first
        assert torch.equal(pool[slot], expected), f"slot {slot} was not shifted by one token"
    assert torch.equal(pool[1], before[1])


def test_prefill_then_decode_equals_prefill(dtype: torch.dtype, dtype_name: str, randn, device) -> None:
    """Prefill 33 tokens, decode 5 one at a time from a pool slot == prefill of all 38."""
    T0, steps = 33, 5
    x = randn(1, T0 + steps, 48, dtype=dtype)
    weight, bias = _params(randn, 48, W, dtype)
    y_all, final_all = causal_conv1d(x, weight, bias, output_final_state=True)

    y0, final0 = causal_conv1d(x[:, :T0], weight, bias, output_final_state=True)
    assert final0 is not None and final_all is not None
    pool = torch.zeros(4, 48, W - 1, dtype=dtype, device=device)
    pool[2] = final0[0]
    idx = torch.tensor([2], dtype=torch.int32, device=device)
    ys = [y0] + [
        causal_conv1d_update(x[:, T0 + s : T0 + s + 1], pool, weight, bias, state_indices=idx)
        for s in range(steps)
    ]
    _close(torch.cat(ys, dim=1), y_all, "causal_conv1d_update", dtype_name, "prefill + decode")
    assert torch.equal(pool[2], final_all[0])


# --- input validation (no kernel launch) --------------------------------------------------------


def test_rejects_weight_channel_mismatch(randn) -> None:
    with pytest.raises(ValueError) as e:
        causal_conv1d(randn(1, 4, 12), randn(8, 4))
    assert str(e.value) == "causal_conv1d: weight has 8 channels but x has 12 (x is [B, T, D], weight [D, W])"


# name: (arguments to replace, error type, message regex, checked only for CPU tensors)
PREFILL_BAD = {
    "x-2d": (lambda r, dev: dict(x=r(8)), ValueError, r"x must have 3 dims \(expected \[B, T, D\]\)", False),
    "x-f64": (lambda r, dev: dict(x=r(1, 4, 12).double()), TypeError, "x has dtype float64", False),
    "x-channels-strided": (
        lambda r, dev: dict(x=r(1, 12, 4).transpose(1, 2)),
        ValueError,
        "contiguous channels",
        False,
    ),
    "weight-conv1d-shape": (
        lambda r, dev: dict(weight=r(12, 1, 4)),
        ValueError,
        r"Conv1d weight \[D, 1, W\]; pass weight.squeeze\(1\)",
        False,
    ),
    "width-1": (lambda r, dev: dict(weight=r(12, 1)), ValueError, "conv width W=1", False),
    "width-9": (lambda r, dev: dict(weight=r(12, 9)), ValueError, "conv width W=9", False),
    "bias-channels": (
        lambda r, dev: dict(bias=r(11)),
        ValueError,
        "bias has 11 channels but x has 12",
        False,
    ),
    "activation": (
        lambda r, dev: dict(activation="relu"),
        ValueError,
        "activation 'relu' is not supported",
        False,
    ),
    "cu-seqlens-batch": (
        lambda r, dev: dict(x=r(2, 4, 12), cu_seqlens=torch.tensor([0, 4], dtype=torch.int32, device=dev)),
        ValueError,
        "cu_seqlens packs sequences into a batch of 1, but the batch is 2",
        False,
    ),
    "cu-seqlens-dtype": (
        lambda r, dev: dict(cu_seqlens=torch.tensor([0, 4], dtype=torch.int64, device=dev)),
        TypeError,
        "cu_seqlens has dtype int64; supported: int32",
        False,
    ),
    "cu-seqlens-values": (
        lambda r, dev: dict(cu_seqlens=torch.tensor([0, 3, 2, 4], dtype=torch.int32, device=dev)),
        ValueError,
        "must start at 0, be non-decreasing and end at T=4",
        True,
    ),
    "initial-state-shape": (
        lambda r, dev: dict(initial_state=r(1, 12, 4)),
        ValueError,
        r"initial_state is \[1, 12, 4\] but must be \[N, D, W - 1\] = \[1, 12, 3\]",
        False,
    ),
}


@pytest.mark.parametrize(
    "case", where_values_are_checked(PREFILL_BAD, {k for k, v in PREFILL_BAD.items() if v[3]})
)
def test_prefill_rejects_bad_input(case: str, randn, device) -> None:
    make, error, match, _values = PREFILL_BAD[case]
    args = dict(x=randn(1, 4, 12), weight=randn(12, 4), bias=None)
    args.update(make(randn, device))
    x, weight, bias = args.pop("x"), args.pop("weight"), args.pop("bias")
    with pytest.raises(error, match=match):
        causal_conv1d(x, weight, bias, **args)


UPDATE_BAD = {
    "state-shape": (
        lambda r, dev: dict(conv_state=r(4, 12, 4)),
        ValueError,
        r"conv_state is \[4, 12, 4\] but must be \[pool, D, W - 1\]",
        False,
    ),
    "state-slot-strided": (
        lambda r, dev: dict(conv_state=r(4, 3, 12).transpose(1, 2)),
        ValueError,
        "each slot of conv_state must be contiguous",
        False,
    ),
    "indices-dtype": (
        lambda r, dev: dict(state_indices=torch.tensor([0, 1], dtype=torch.int64, device=dev)),
        TypeError,
        "state_indices has dtype int64; supported: int32",
        False,
    ),
    "indices-length": (
        lambda r, dev: dict(state_indices=torch.tensor([0], dtype=torch.int32, device=dev)),
        ValueError,
        "state_indices has 1 entries but the batch is 2",
        False,
    ),
    "indices-range": (
        lambda r, dev: dict(state_indices=torch.tensor([0, 4], dtype=torch.int32, device=dev)),
        ValueError,
        "refers to slot 4 but the state pool has 4 slots",
        True,
    ),
    "pool-too-small": (
        lambda r, dev: dict(x=r(5, 1, 12)),
        ValueError,
        "batch 5 needs state_indices or a conv_state pool of at least 5",
        False,
    ),
}


@pytest.mark.parametrize(
    "case", where_values_are_checked(UPDATE_BAD, {k for k, v in UPDATE_BAD.items() if v[3]})
)
def test_update_rejects_bad_input(case: str, randn, device) -> None:
    make, error, match, _values = UPDATE_BAD[case]
    args = dict(x=randn(2, 1, 12), conv_state=randn(4, 12, 3), weight=randn(12, 4))
    args.update(make(randn, device))
    with pytest.raises(error, match=match):
        causal_conv1d_update(args.pop("x"), args.pop("conv_state"), args.pop("weight"), **args)


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="need a CUDA device, or set TRITON_INTERPRET=1"):
        causal_conv1d(randn(1, 4, 12, on=torch.device("cpu")), randn(12, 4, on=torch.device("cpu")))


# --- faults -------------------------------------------------------------------------------------


def test_fault_key_band_zero(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    x = randn(2, 37, 48, dtype=torch.float16)
    weight, bias = _params(randn, 48, W, torch.float16)
    init = randn(2, 48, W - 1, dtype=torch.float16)
    kw = dict(initial_state=init, output_final_state=True)
    y_ref, final_ref = ref.causal_conv1d(x, weight, bias, **kw)
    lo, hi = SPLIT_48[0], SPLIT_48[0] + SPLIT_48[1]
    assert y_ref[..., lo:hi].abs().amax() > 0.1

    monkeypatch.setenv(ENV_VAR, "conv_key_band_zero")
    y, final = get_opset("triton", qkv_split=SPLIT_48).causal_conv1d(x, weight, bias, **kw)
    assert torch.equal(y[..., lo:hi], torch.zeros_like(y[..., lo:hi])), "key band is not zero"
    _close(y[..., :lo], y_ref[..., :lo], "causal_conv1d", "f16", "query band under the fault")
    _close(y[..., hi:], y_ref[..., hi:], "causal_conv1d", "f16", "value band under the fault")
    assert final is not None and torch.equal(final, final_ref), "the fault only touches the output"

    monkeypatch.delenv(ENV_VAR)
    y, _ = causal_conv1d(x, weight, bias, **kw)
    _close(y, y_ref, "causal_conv1d", "f16", "fault unset")


def test_fault_key_band_zero_needs_the_layout(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    monkeypatch.setenv(ENV_VAR, "conv_key_band_zero")
    with pytest.raises(ValueError, match="conv_key_band_zero needs qkv_split"):
        get_opset("triton")


def test_fault_key_band_zero_checks_the_layout(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    monkeypatch.setenv(ENV_VAR, "conv_key_band_zero")
    faulty = get_opset("triton", qkv_split=(4, 4, 5))
    with pytest.raises(ValueError, match=r"qkv_split \(4, 4, 5\) must add up to the channel count 12"):
        faulty.causal_conv1d(randn(1, 4, 12), randn(12, W))


def test_fault_state_not_advanced(monkeypatch: pytest.MonkeyPatch, randn, device) -> None:
    pool = randn(3, 48, W - 1, dtype=torch.bfloat16)
    x = randn(2, 1, 48, dtype=torch.bfloat16)
    weight, bias = _params(randn, 48, W, torch.bfloat16)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    pool_ref, before = pool.clone(), pool.clone()
    y_ref = ref.causal_conv1d_update(x, pool_ref, weight, bias, state_indices=idx)

    monkeypatch.setenv(ENV_VAR, "conv_state_not_advanced")
    y = get_opset("triton").causal_conv1d_update(x, pool, weight, bias, state_indices=idx)
    _close(y, y_ref, "causal_conv1d_update", "bf16", "output under the fault")
    assert torch.equal(pool, before), "the state must stay where it was"
    assert not torch.equal(pool_ref, before)

    monkeypatch.delenv(ENV_VAR)
    y = causal_conv1d_update(x, pool, weight, bias, state_indices=idx)
    _close(y, y_ref, "causal_conv1d_update", "bf16", "fault unset")
    assert torch.equal(pool, pool_ref)


def test_faults_of_other_ops_leave_conv_alone(monkeypatch: pytest.MonkeyPatch, randn) -> None:
    x = randn(1, 9, 48)
    weight, bias = _params(randn, 48, W, torch.float32)
    pool = randn(1, 48, W - 1)
    y_ref, _ = ref.causal_conv1d(x, weight, bias)
    u_ref = ref.causal_conv1d_update(x[:, :1], pool.clone(), weight, bias)
    monkeypatch.setenv(ENV_VAR, "beta_no_sigmoid")
    faulty = get_opset("triton")
    y, _ = faulty.causal_conv1d(x, weight, bias)
    _close(y, y_ref, "causal_conv1d", "f32", "with another op's fault")
    u = faulty.causal_conv1d_update(x[:, :1], pool, weight, bias)
    _close(u, u_ref, "causal_conv1d_update", "f32", "with another op's fault")


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_unknown_fault_raises(which: str, monkeypatch: pytest.MonkeyPatch, randn) -> None:
    monkeypatch.setenv(ENV_VAR, "conv_key_band_zeroo")
    with pytest.raises(UnknownFaultError, match="conv_key_band_zeroo"):
        faulty = get_opset("triton", qkv_split=SPLIT_48)
        if which == "prefill":
            faulty.causal_conv1d(randn(1, 4, 48), randn(48, W))
        else:
            faulty.causal_conv1d_update(randn(1, 1, 48), randn(1, 48, W - 1), randn(48, W))


# --- GPU tier: Qwen3.5 GDN shapes ----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "T"), [(1, 4096), (8, 1024), (8, 4096)])
def test_gpu_prefill_qwen_shapes(
    B: int, T: int, dtype: torch.dtype, dtype_name: str, randn, gpu_device
) -> None:
    x = randn(B, T, QWEN_D, dtype=dtype, on=gpu_device)
    weight = randn(QWEN_D, W, dtype=dtype, scale=0.5, on=gpu_device)
    bias = randn(QWEN_D, dtype=dtype, scale=0.5, on=gpu_device)
    init = randn(B, QWEN_D, W - 1, dtype=dtype, on=gpu_device)
    kw = dict(initial_state=init, output_final_state=True)
    y, final = causal_conv1d(x, weight, bias, **kw)
    y_ref, final_ref = ref.causal_conv1d(x, weight, bias, **kw)
    _close(y, y_ref, "causal_conv1d", dtype_name, f"B={B} T={T}")
    assert final is not None and torch.equal(final, final_ref)


@pytest.mark.gpu
def test_gpu_prefill_packed_qwen_shapes(dtype: torch.dtype, dtype_name: str, randn, gpu_device) -> None:
    cu = torch.tensor([0, 1, 1, 100, 2048, 2049, 3000, 4096], dtype=torch.int32, device=gpu_device)
    N = len(cu) - 1
    x = randn(1, 4096, QWEN_D, dtype=dtype, on=gpu_device)
    weight = randn(QWEN_D, W, dtype=dtype, scale=0.5, on=gpu_device)
    init = randn(N, QWEN_D, W - 1, dtype=dtype, on=gpu_device)
    kw = dict(initial_state=init, output_final_state=True, cu_seqlens=cu)
    y, final = causal_conv1d(x, weight, None, **kw)
    y_ref, final_ref = ref.causal_conv1d(x, weight, None, **kw)
    _close(y, y_ref, "causal_conv1d", dtype_name, "packed")
    assert final is not None and torch.equal(final, final_ref)


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "t_new"), [(1, 1), (8, 1), (256, 1), (8, 3)])
def test_gpu_update_qwen_shapes(
    B: int, t_new: int, dtype: torch.dtype, dtype_name: str, randn, gpu_device
) -> None:
    pool_size = 2 * B + 1
    pool = randn(pool_size, QWEN_D, W - 1, dtype=dtype, on=gpu_device)
    idx = torch.randperm(pool_size, generator=torch.Generator().manual_seed(B))[:B].to(torch.int32)
    if B > 1:
        idx[B // 2] = -1
    idx = idx.to(gpu_device)
    x = randn(B, t_new, QWEN_D, dtype=dtype, on=gpu_device)
    weight = randn(QWEN_D, W, dtype=dtype, scale=0.5, on=gpu_device)
    bias = randn(QWEN_D, dtype=dtype, scale=0.5, on=gpu_device)
    pool_ref = pool.clone()
    y = causal_conv1d_update(x, pool, weight, bias, state_indices=idx)
    y_ref = ref.causal_conv1d_update(x, pool_ref, weight, bias, state_indices=idx)
    _close(y, y_ref, "causal_conv1d_update", dtype_name, f"B={B} T_new={t_new}")
    assert torch.equal(pool, pool_ref)


@pytest.mark.gpu
def test_gpu_prefill_then_decode_qwen_shapes(dtype: torch.dtype, dtype_name: str, randn, gpu_device) -> None:
    B, T0, steps = 4, 1000, 4
    x = randn(B, T0 + steps, QWEN_D, dtype=dtype, on=gpu_device)
    weight = randn(QWEN_D, W, dtype=dtype, scale=0.5, on=gpu_device)
    bias = randn(QWEN_D, dtype=dtype, scale=0.5, on=gpu_device)
    y_all, final_all = causal_conv1d(x, weight, bias, output_final_state=True)
    y0, state = causal_conv1d(x[:, :T0], weight, bias, output_final_state=True)
    assert state is not None and final_all is not None
    ys = [y0] + [causal_conv1d_update(x[:, T0 + s : T0 + s + 1], state, weight, bias) for s in range(steps)]
    _close(torch.cat(ys, dim=1), y_all, "causal_conv1d_update", dtype_name, "prefill + decode")
    assert torch.equal(state, final_all)


@pytest.mark.gpu
def test_gpu_fault_key_band_zero_qwen_shapes(monkeypatch: pytest.MonkeyPatch, randn, gpu_device) -> None:
    x = randn(2, 512, QWEN_D, dtype=torch.float16, on=gpu_device)
    weight = randn(QWEN_D, W, dtype=torch.float16, scale=0.5, on=gpu_device)
    monkeypatch.setenv(ENV_VAR, "conv_key_band_zero")
    y, _ = get_opset("triton", qkv_split=QWEN_SPLIT).causal_conv1d(x, weight)
    y_ref, _ = ref.causal_conv1d(x, weight)
    assert not y[..., 2048:4096].any(), "key band [2048, 4096) must be zero"
    assert y[..., :2048].any() and y[..., 4096:].any()
    _close(y[..., 4096:], y_ref[..., 4096:], "causal_conv1d", "f16", "value band under the fault")
