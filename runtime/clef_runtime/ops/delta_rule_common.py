"""What the chunked (prefill) and fused recurrent (decode) delta-rule kernels share: input checks
that name the argument and the fix, the dtype policy turned into compile-time kernel flags, and
an in-kernel rounding helper for the interpreter.

Dtype policy (see `clef_runtime.opset`): the state and every accumulation are float32.  The dots
inside a chunk (k kᵀ, q kᵀ, the WY products) take operands in the input dtype so bf16/f16 run on
tensor cores; the dots that read or write the *state* take:

* bf16: bf16 operands (bf16 has float32's exponent range, so rounding the state for a dot loses
  precision, never range);
* f16: float32 operands at TF32 precision: TF32 keeps f16's 10-bit mantissa but float32's
  exponent, so a state beyond 65504 (a long context) never overflows, yet Ampere/Hopper still use
  tensor cores (pre-Ampere GPUs such as the V100 fall back to exact float32 FMA);
* f32: float32 operands in IEEE mode (no TF32), so f32 stays accurate to a few ulps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from clef_runtime.dtypes import torch_dtypes
from clef_runtime.interpreter import interpreted
from clef_runtime.ops._common import next_pow2

# The largest key/value head dim the kernels hold in registers (one tile per program).
MAX_HEAD_DIM = 256
# Below this a tl.dot operand dim is padded (Triton needs every dot dim ≥ 16).
MIN_DOT_DIM = 16


@dataclass(frozen=True)
class DotPolicy:
    """Compile-time dtype flags for one input dtype (see the module docstring)."""

    chunk_dtype: tl.dtype  # operand dtype of the within-chunk dots
    state_dtype: tl.dtype  # operand dtype of the dots that touch the state
    state_precision: str  # input_precision of those dots (float32 operands only)
    solve_precision: str  # input_precision of the float32 dots of the triangular solve
    round_bf16: bool  # interpreter only: round to bf16 explicitly (see `dot_policy`)


def dot_policy(dtype: torch.dtype, kernel: object, tensor_cores: bool = True) -> DotPolicy:
    """The flags for inputs of `dtype` running `kernel`, on tensor cores or on the FMA path.

    The FMA path (``tensor_cores`` False: the V100's configuration) asks for IEEE float32 where
    tensor cores take TF32: an FMA dot has no TF32, so on the V100 the two compile to the same
    exact float32 loops, and a GPU that has TF32 (an H200 running the V100's configuration
    forced, `clef_runtime.kernel_config`) then computes what the V100 computes.

    Triton 3.6's interpreter gets bf16 wrong twice: ``tl.dot`` multiplies the raw uint16 bits of
    bf16 operands, and float32 → bf16 casts truncate instead of rounding to nearest even (biased
    errors that add up coherently in dots, about 4× the GPU's error here).  Under the interpreter
    bf16 operands are therefore kept as float32 values rounded to bf16 by `rne_bf16` at every
    point where the GPU rounds; the products of bf16 values are exact in float32, so the
    interpreter then computes what the GPU's bf16 tensor cores compute."""
    if dtype == torch.bfloat16:
        if interpreted(kernel):
            return DotPolicy(tl.float32, tl.float32, "ieee", "ieee", True)
        return DotPolicy(tl.bfloat16, tl.bfloat16, "ieee", "tf32" if tensor_cores else "ieee", False)
    if dtype == torch.float16:
        tf32 = "tf32" if tensor_cores else "ieee"
        return DotPolicy(tl.float16, tl.float32, tf32, tf32, False)
    return DotPolicy(tl.float32, tl.float32, "ieee", "ieee", False)


@functools.lru_cache(maxsize=16)
def capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability, asked once per device (a host-side query per call
    would cost every launch)."""
    return torch.cuda.get_device_capability(device)


def tensor_core_dots(dtype: torch.dtype, device: torch.device, forced: bool | None = None) -> bool:
    """Whether the kernels' dots run on tensor cores.  Not for float32 (IEEE dots are FMA
    loops) nor before Ampere: Triton 3.6 has no MMA path for sm70 (the V100), so there every
    dot is an FMA loop that holds whole operand rows per thread and wants narrow tiles.  The
    interpreter takes the tensor-core configuration unless told otherwise.  ``forced`` (from
    `clef_runtime.kernel_config`) overrides the device for 16-bit inputs: the tests and
    `verify --kernel-config fma` run the V100's configuration anywhere."""
    if dtype == torch.float32:
        return False
    if forced is not None:
        return forced
    if device.type != "cuda":
        return True
    return capability(device)[0] >= 8


def pow2_at_least(n: int, floor: int = MIN_DOT_DIM) -> int:
    return max(floor, next_pow2(n))


def check_gdn_inputs(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[int, int, int, int, int, int]:
    """Validate the q/k/v/g/beta of either delta-rule op; returns (B, T, H, HV, K, V)."""
    if q.dim() != 4:
        raise ValueError(f"{op}: q must be [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"{op}: k must have q's shape {tuple(q.shape)} ([B, T, H, K]), got {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"{op}: v must be [B, T, HV, V] with q's B={B}, T={T}, got shape {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        raise ValueError(
            f"{op}: value heads HV={HV} must be a positive multiple of key heads H={H} "
            "(value head i reads key head i // (HV // H))"
        )
    for name, d in (("K", K), ("V", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{op}: head dim {name}={d} is outside 1..{MAX_HEAD_DIM} that the kernels hold")
    if q.dtype not in torch_dtypes().values():
        raise TypeError(f"{op}: q dtype {q.dtype} is not supported; use float32, bfloat16 or float16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: {name} is {t.dtype} but q is {q.dtype}; cast q, k and v to one dtype")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (B, T, HV):
            raise ValueError(f"{op}: {name} must be [B, T, HV] = {(B, T, HV)}, got {tuple(t.shape)}")
        if t.dtype != torch.float32:
            raise TypeError(f"{op}: {name} must be float32 (got {t.dtype}); pass {name}.float()")
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous; pass {name}.contiguous()")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Token and batch strides are free (q/k/v are usually views of the conv output), but
        # one token's heads must be packed: the kernels address [head, dim] as one block.
        if t.stride(3) != 1 or t.stride(2) != t.shape[3]:
            raise ValueError(
                f"{op}: {name} must have its last two dims contiguous (strides [..., {t.shape[3]}, 1]), "
                f"got strides {tuple(t.stride())}; pass {name}.contiguous()"
            )
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.device != q.device:
            raise ValueError(
                f"{op}: {name} is on {t.device} but q is on {q.device}; put all inputs on one device"
            )
    return B, T, H, HV, K, V


def check_state(op: str, name: str, state: torch.Tensor, n: int | None, HV: int, K: int, V: int) -> None:
    """A recurrent state: float32, contiguous ``[n, HV, K, V]`` (``n`` None: any pool size)."""
    want = f"[{'pool' if n is None else n}, HV={HV}, K={K}, V={V}]"
    if state.dim() != 4 or state.shape[1:] != (HV, K, V) or (n is not None and state.shape[0] != n):
        raise ValueError(f"{op}: {name} must be float32 {want}, got shape {tuple(state.shape)}")
    if state.dtype != torch.float32:
        raise TypeError(
            f"{op}: {name} must be float32 {want} (the state is always float32), got {state.dtype}"
        )
    if not state.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous; pass {name}.contiguous()")


@triton.jit
def l2_prefetch(ptrs):
    """Ask L2 for the 128-byte line of every address in ``ptrs`` (``prefetch.global.L2``: a hint
    that waits for nothing and takes no register; compiled kernels only, the interpreter has no
    PTX)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def rne_bf16(x):
    """float32 ``x`` rounded to the nearest bf16 value (ties to even), kept as float32: the
    interpreter's own float32 → bf16 cast truncates (see `dot_policy`).  inf stays inf."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def seq_bounds(n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
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
def chunk_bounds(
    idx, k_p, skt, g_p, beta_p, bos, eos,
    HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, NORMALISED: tl.constexpr,
):  # fmt: skip
    """The log bounds of chunks `idx` (< 0: none, 0) of one sequence and value head, for the split
    design's warm-up walks (`clef_runtime.ops.delta_rule_chunk_split`): each chunk's
    Σ (g + log max(1, |1 - β |k|²|)) over its tokens (`g_p`, `beta_p`: the sequence's rows of g
    and β, stride HV).  With L2-normalised keys (NORMALISED) |k̂|² ≤ 1, so the gates alone give
    it (max(1, |1 - β|)); otherwise each key's |k|² comes from its row (`k_p`: the sequence's key
    head, rows `skt` apart), 32 columns at a time."""
    live = idx >= 0
    t = (bos + idx * BT)[:, None] + tl.arange(0, BT)[None, :]
    m = live[:, None] & (t < eos)
    gv = tl.load(g_p + t * HV, mask=m, other=0.0)
    bt = tl.load(beta_p + t * HV, mask=m, other=0.0)
    if NORMALISED:
        grow = tl.maximum(tl.abs(1.0 - bt), 1.0)
    else:
        nk2 = gv * 0.0
        for c0 in tl.static_range(0, BK, 32):
            cols = c0 + tl.arange(0, 32)
            kk = tl.load(
                k_p + t[:, :, None] * skt + cols[None, None, :],
                mask=m[:, :, None] & (cols < K)[None, None, :], other=0.0,
            ).to(tl.float32)  # fmt: skip
            nk2 += tl.sum(kk * kk, 2)
        grow = tl.maximum(tl.abs(1.0 - bt * nk2), 1.0)
    return tl.sum(gv + tl.log(grow), 1)


# fmt: off
@triton.jit
def _warmup_step(
    k_p, skt, g_p, beta_p, bos, eos, log_bound, acc, c_w, hi,
    HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, WB: tl.constexpr,
    NORMALISED: tl.constexpr,
):
    """One step of `warmup_start` back from chunk ``hi``: the WB chunks below it, ``acc`` the log
    bound of chunks ``hi .. c_lo - 1``; returns (acc, c_w, hi) for the next step (hi ≤ 0
    once the start is found or the walk is past the sequence start)."""
    i = tl.arange(0, WB)
    idx = hi - 1 - i
    vals = chunk_bounds(idx, k_p, skt, g_p, beta_p, bos, eos, HV, K, BK, BT, NORMALISED)
    cs = acc + tl.cumsum(vals, 0)  # cs[i]: the log bound of chunks idx[i] .. c_lo - 1
    first = tl.min(tl.where((cs < log_bound) & (idx >= 0), i, WB), 0)
    c_w = tl.where(first < WB, hi - 1 - first, c_w)
    return acc + tl.sum(vals, 0), c_w, tl.where(first < WB, 0, hi - WB)


@triton.jit
def warmup_start(
    k_p, skt, g_p, beta_p, c_lo, bos, eos, log_bound,
    HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, WB: tl.constexpr,
    NORMALISED: tl.constexpr, WB0: tl.constexpr = 0,
):
    """The chunk a segment starting at chunk ``c_lo`` warms up from: the largest ``c_w < c_lo``
    whose chunks ``c_w .. c_lo - 1`` have log bounds (`chunk_bounds`) summing below
    ``log_bound``, so that their map carries a start-state error of at most ``e^{log_bound}``
    times the true state at ``c_w`` to ``c_lo``; -1 when no such chunk exists (walk from the
    sequence start and its initial state: exact).  The walk back reads WB0 chunks first (if > 0),
    then WB a step: a short first step finds the common short warm-ups with fewer loads, the wider
    ones reach far starts in fewer dependent steps."""
    acc = log_bound * 0.0
    c_w = c_lo * 0 - 1
    hi = c_lo
    if WB0 > 0:
        acc, c_w, hi = _warmup_step(
            k_p, skt, g_p, beta_p, bos, eos, log_bound, acc, c_w, hi, HV, K, BK, BT, WB0, NORMALISED
        )
    while hi > 0:  # (a while loop: the interpreter cannot take a runtime range bound)
        acc, c_w, hi = _warmup_step(
            k_p, skt, g_p, beta_p, bos, eos, log_bound, acc, c_w, hi, HV, K, BK, BT, WB, NORMALISED
        )
    return c_w
# fmt: on
