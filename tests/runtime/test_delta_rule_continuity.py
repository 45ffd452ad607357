"""The delta-rule kernels agree with themselves across the ways a server splits a sequence:

* prefill(a) then prefill(b) from the carried state equals prefill(a + b);
* prefill then token-by-token fused-recurrent decode equals the prefill of the whole sequence;
* packed variable-length prefill equals one prefill per sequence;
* decode through a permuted state pool with padding rows equals decoding each row alone.

Kernel-vs-kernel comparisons use the op's tolerance (both sides are within it of the float64
reference).  CPU tier: small K/V under the interpreter; GPU tier: the real shapes at T = 8192.
The prefill side runs f16 under both launch configurations (``dtype_config``: tensor cores and the
V100's FMA path, forced).
"""

from __future__ import annotations

import pytest
import torch

from clef_runtime.compare import assert_close
from clef_runtime.dtypes import torch_dtype
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule
from clef_runtime.ops.delta_rule_recurrent import fused_recurrent_gated_delta_rule
from clef_runtime.opset import get_opset
from clef_runtime.reference import delta_rule as ref
from clef_runtime.tolerances import tolerance

CHUNK = "chunk_gated_delta_rule"
DECODE = "fused_recurrent_gated_delta_rule"


def _cut(ts: tuple[torch.Tensor, ...], a: int, b: int) -> list[torch.Tensor]:
    """Tokens a..b of every input (q/k/v may stay strided views; g and beta must be packed)."""
    return [t[:, a:b] if t.dim() == 4 else t[:, a:b].contiguous() for t in ts]


def check_split_prefill(
    rng: torch.Generator,
    device: torch.device,
    dtype_name: str,
    *,
    B: int,
    T: int,
    split: int,
    with_reference: bool,
    kernel_config: str = "auto",
) -> None:
    chunk = get_opset("triton", kernel_config=kernel_config).chunk_gated_delta_rule
    dims = dict(H=1, HV=2, K=16, V=32) if device.type == "cpu" else dict(H=16, HV=32, K=128, V=128)
    x = gdn_inputs(rng, device, torch_dtype(dtype_name), B=B, T=T, **dims)
    h0 = (0.1 * torch.randn(B, dims["HV"], dims["K"], dims["V"], generator=rng)).to(device)
    kw = dict(use_qk_l2norm=True, output_final_state=True)
    whole, h_whole = chunk(*x, initial_state=h0, **kw)
    first, h_mid = chunk(*_cut(x, 0, split), initial_state=h0, **kw)
    second, h_end = chunk(*_cut(x, split, T), initial_state=h_mid, **kw)
    assert h_whole is not None and h_end is not None
    tol = tolerance(CHUNK, dtype_name)
    assert_close(torch.cat([first, second], 1), whole, tol, f"{dtype_name} prefill(a)+prefill(b) output")
    assert_close(h_end, h_whole, tol, f"{dtype_name} prefill(a)+prefill(b) final state")
    if with_reference:
        ro, rh = ref.chunk_gated_delta_rule(*x, initial_state=h0, **kw)  # type: ignore[arg-type]
        assert rh is not None
        assert_close(whole, ro, tol, f"{dtype_name} prefill output vs reference")
        assert_close(h_whole, rh, tol, f"{dtype_name} prefill final state vs reference")


def check_prefill_then_decode(
    rng: torch.Generator,
    device: torch.device,
    dtype_name: str,
    *,
    B: int,
    T: int,
    steps: int,
    kernel_config: str = "auto",
) -> None:
    chunk = get_opset("triton", kernel_config=kernel_config).chunk_gated_delta_rule
    dims = dict(H=2, HV=4, K=16, V=16) if device.type == "cpu" else dict(H=16, HV=32, K=128, V=128)
    x = gdn_inputs(rng, device, torch_dtype(dtype_name), B=B, T=T, **dims)
    whole, h_whole = chunk(*x, use_qk_l2norm=True, output_final_state=True)
    head, state = chunk(*_cut(x, 0, T - steps), use_qk_l2norm=True, output_final_state=True)
    assert state is not None and h_whole is not None
    outs = [head]
    for t in range(T - steps, T):  # one token per call, as a server decodes
        outs.append(fused_recurrent_gated_delta_rule(*_cut(x, t, t + 1), state=state, use_qk_l2norm=True))
    tol = tolerance(DECODE, dtype_name)
    assert_close(torch.cat(outs, 1), whole, tol, f"{dtype_name} prefill+decode output")
    assert_close(state, h_whole, tol, f"{dtype_name} prefill+decode final state")


# --- CPU tier -----------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 70])
def test_split_prefill(
    split: int, dtype_config: tuple[str, str], rng: torch.Generator, device: torch.device
) -> None:
    """Splits off the chunk grid (1, 70), so the two runs chunk the tokens differently."""
    dtype_name, config = dtype_config
    kw = dict(B=2, T=150, split=split, with_reference=False, kernel_config=config)
    check_split_prefill(rng, device, dtype_name, **kw)  # type: ignore[arg-type]


def test_prefill_then_decode(
    dtype_config: tuple[str, str], rng: torch.Generator, device: torch.device
) -> None:
    dtype_name, config = dtype_config
    check_prefill_then_decode(rng, device, dtype_name, B=2, T=68, steps=5, kernel_config=config)


def test_packed_equals_separate(rng: torch.Generator, device: torch.device) -> None:
    lens = [70, 1, 0, 64, 5]
    H, HV, K, V = 1, 2, 16, 16
    x = gdn_inputs(rng, device, torch.bfloat16, B=1, T=sum(lens), H=H, HV=HV, K=K, V=V)
    h0 = (0.1 * torch.randn(len(lens), HV, K, V, generator=rng)).to(device)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    packed, h_packed = chunk_gated_delta_rule(
        *x, initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=True
    )
    assert h_packed is not None
    tol = tolerance(CHUNK, "bf16")
    for n in range(len(lens)):
        a, b = int(cu[n]), int(cu[n + 1])
        o, h = chunk_gated_delta_rule(
            *_cut(x, a, b), initial_state=h0[n : n + 1], output_final_state=True, use_qk_l2norm=True
        )
        assert h is not None
        if b > a:
            assert_close(packed[:, a:b], o, tol, f"sequence {n} output")
        assert_close(h_packed[n : n + 1], h, tol, f"sequence {n} final state")
    assert torch.equal(h_packed[2], h0[2]), "an empty sequence must hand its initial state back"


def test_decode_through_permuted_pool_with_padding(rng: torch.Generator, device: torch.device) -> None:
    B, T, H, HV, K, V = 4, 2, 1, 2, 32, 16
    x = gdn_inputs(rng, device, torch.float16, B=B, T=T, H=H, HV=HV, K=K, V=V)
    pool = (0.3 * torch.randn(6, HV, K, V, generator=rng)).to(device)
    indices = [5, -1, 2, 0]
    state = pool.clone()
    o = fused_recurrent_gated_delta_rule(
        *x,
        state=state,
        state_indices=torch.tensor(indices, dtype=torch.int32, device=device),
        use_qk_l2norm=True,
    )
    tol = tolerance(DECODE, "f16")
    for row, slot in enumerate(indices):
        if slot < 0:
            assert torch.count_nonzero(o[row]) == 0, "a padding row must output zeros"
            continue
        alone = pool[slot : slot + 1].clone()
        o_alone = fused_recurrent_gated_delta_rule(
            *[t[row : row + 1] for t in x], state=alone, use_qk_l2norm=True
        )
        assert_close(o[row : row + 1], o_alone, tol, f"row {row} output")
        assert_close(state[slot : slot + 1], alone, tol, f"row {row} state (slot {slot})")
    for slot in (1, 3, 4):  # no row points here, padding included
        assert torch.equal(state[slot], pool[slot]), f"slot {slot} changed but no row uses it"


# --- GPU tier: the real Qwen3.5 GDN shapes at long context --------------------------------------


@pytest.mark.gpu
def test_split_prefill_gpu(
    dtype_config: tuple[str, str], rng: torch.Generator, gpu_device: torch.device
) -> None:
    dtype_name, config = dtype_config
    # T = 8192 is past what the float64 reference does in reasonable time: kernel vs kernel only
    kw = dict(kernel_config=config)
    check_split_prefill(rng, gpu_device, dtype_name, B=2, T=8192, split=3001, with_reference=False, **kw)
    check_split_prefill(rng, gpu_device, dtype_name, B=1, T=2048, split=1000, with_reference=True, **kw)


@pytest.mark.gpu
def test_prefill_then_decode_gpu(
    dtype_config: tuple[str, str], rng: torch.Generator, gpu_device: torch.device
) -> None:
    dtype_name, config = dtype_config
    check_prefill_then_decode(rng, gpu_device, dtype_name, B=4, T=8192, steps=8, kernel_config=config)
