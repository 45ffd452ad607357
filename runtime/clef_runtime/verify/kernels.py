"""The `kernels` suite: every runtime op against its float64 reference, at the model's head counts
and dims and the deployed dtype, on seeded random inputs.

Each case produces, per output tensor, two error checks (``rel_rms``, ``rel_max`` against
`clef_runtime.tolerances`) and one coverage check (no band, head or state slice dead in the
candidate but alive in the reference).  Cases chain the way a GDN layer does (conv → gating →
delta rule → gated norm; prefill → decode), so a kernel that corrupts state it hands on is caught
where the next op reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from clef_runtime.compare import errors
from clef_runtime.dtypes import torch_dtype
from clef_runtime.inputs import gdn_inputs
from clef_runtime.opset import OpSet
from clef_runtime.tolerances import Tolerance, tolerance
from clef_runtime.verify.coverage import Slice, conv_channel_slices, dead_slices, per_index_slices
from clef_runtime.verify.report import Check

SUITE = "kernels"


@dataclass(frozen=True)
class GdnShape:
    """The GDN head layout under test (from the model config)."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_width: int

    @property
    def qkv_split(self) -> tuple[int, int, int]:
        nk = self.key_heads * self.key_dim
        return (nk, nk, self.value_heads * self.value_dim)

    @property
    def conv_dim(self) -> int:
        return sum(self.qkv_split)


@dataclass(frozen=True)
class Sizes:
    """Token counts: large enough to cross chunk boundaries, small enough for the budget."""

    batch: int
    prefill: int  # tokens per sequence in the batched cases (not a multiple of the chunk)
    varlen: tuple[int, ...]  # packed sequence lengths (includes 1 and a non-multiple of 64)
    decode_steps: int
    long: int  # tokens of the long-context case (state growth, f16 range)


MODEL_SIZES = Sizes(batch=2, prefill=1000, varlen=(1, 63, 300, 701), decode_steps=8, long=4096)
REDUCED_SIZES = Sizes(batch=2, prefill=70, varlen=(1, 13, 66), decode_steps=3, long=160)


class _Case:
    """Collects the checks of one case, timing them together."""

    def __init__(self, op: str, case: str, dtype_name: str, tolerance_scale: float = 1.0) -> None:
        self.op, self.case, self.dtype_name = op, case, dtype_name
        self.scale = tolerance_scale
        self.checks: list[Check] = []
        self.start = time.perf_counter()

    def compare(
        self,
        what: str,
        candidate: torch.Tensor,
        reference: torch.Tensor,
        slices: Sequence[Slice] = (),
        tol_op: str | None = None,
    ) -> None:
        base = tolerance(tol_op or self.op, self.dtype_name)
        tol = Tolerance(base.rel_rms * self.scale, base.rel_max * self.scale)
        e = errors(candidate, reference)
        prefix = f"{self.op}/{self.case} {what}"
        for metric, value, limit in (
            ("rel_rms", e.rel_rms, tol.rel_rms),
            ("rel_max", e.rel_max, tol.rel_max),
        ):
            ok = e.finite and value <= limit
            detail = (
                ""
                if ok
                else f"{prefix}: {metric} {value:.3g} > {limit:g}" + ("" if e.finite else " (non-finite)")
            )
            self.checks.append(Check(f"{prefix}: {metric}", self.op, SUITE, ok, metric, value, limit, detail))
        dead = dead_slices(candidate, reference, slices)
        if not e.finite and not dead:
            dead = [f"{what} has non-finite values"]
        detail = "; ".join(f"{self.op}: {d}" for d in dead[:4])
        if len(dead) > 4:
            detail += f"; and {len(dead) - 4} more"
        self.checks.append(
            Check(f"{prefix}: coverage", self.op, SUITE, not dead, "dead_slices", len(dead), 0, detail)
        )

    def done(self) -> list[Check]:
        elapsed = time.perf_counter() - self.start
        for c in self.checks:
            c.duration_s = round(elapsed / max(len(self.checks), 1), 6)
        return self.checks


class _Inputs:
    """Seeded inputs with the statistics of a real GDN layer, drawn on the CPU in float32 so the
    values do not depend on the device, then cast and moved."""

    def __init__(
        self, seed: int, device: torch.device, dtype: torch.dtype, tolerance_scale: float = 1.0
    ) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.device, self.dtype = device, dtype
        self.tolerance_scale = tolerance_scale

    def randn(self, *shape: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen) * scale
        return t.to(device=self.device, dtype=dtype or self.dtype)

    def uniform(self, lo: float, hi: float, *shape: int) -> torch.Tensor:
        t = torch.rand(*shape, generator=self.gen) * (hi - lo) + lo
        return t.to(self.device)

    def gating_params(self, hv: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Like upstream's initialisation: A in (1, 16), dt in (1e-3, 1e-1) through softplus⁻¹.
        A_log = torch.log(self.uniform(1.0, 16.0, hv)).float()
        dt = torch.exp(
            self.uniform(float(torch.log(torch.tensor(1e-3))), float(torch.log(torch.tensor(1e-1))), hv)
        )
        dt_bias = (dt + torch.log(-torch.expm1(-dt))).float()
        return A_log, dt_bias


def _conv_weight(inp: _Inputs, shape: GdnShape) -> torch.Tensor:
    return inp.randn(shape.conv_dim, shape.conv_width, scale=shape.conv_width**-0.5)


def _cu(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _state_slices(shape: GdnShape) -> list[Slice]:
    # [N, HV, K, V]: each value head's state block.
    return per_index_slices(1, shape.value_heads, "state of value head")


def _head_slices(shape: GdnShape) -> list[Slice]:
    # [B, T, HV, V]: each value head's output.
    return per_index_slices(2, shape.value_heads, "output of value head")


def case_conv(fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs) -> list[Check]:
    c = _Case("causal_conv1d", "prefill", dn, inp.tolerance_scale)
    B, T, D, W = sizes.batch, sizes.prefill, shape.conv_dim, shape.conv_width
    x, w = inp.randn(B, T, D), _conv_weight(inp, shape)
    init = inp.randn(B, D, W - 1)
    y, fin = fast.causal_conv1d(x, w, initial_state=init, output_final_state=True)
    ry, rfin = ref.causal_conv1d(x, w, initial_state=init, output_final_state=True)
    assert fin is not None and rfin is not None
    bands = conv_channel_slices(shape.qkv_split, shape.key_dim, shape.value_dim, axis=2)
    c.compare("y", y, ry, bands)
    c.compare(
        "final conv state", fin, rfin, conv_channel_slices(shape.qkv_split, shape.key_dim, shape.value_dim, 1)
    )
    return c.done()


def case_conv_varlen(
    fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs
) -> list[Check]:
    c = _Case("causal_conv1d", "varlen", dn, inp.tolerance_scale)
    total, D = sum(sizes.varlen), shape.conv_dim
    x, w = inp.randn(1, total, D), _conv_weight(inp, shape)
    cu = _cu(sizes.varlen, inp.device)
    y, fin = fast.causal_conv1d(x, w, cu_seqlens=cu, output_final_state=True)
    ry, rfin = ref.causal_conv1d(x, w, cu_seqlens=cu, output_final_state=True)
    assert fin is not None and rfin is not None
    c.compare("y", y, ry, conv_channel_slices(shape.qkv_split, shape.key_dim, shape.value_dim, axis=2))
    c.compare(
        "final conv state", fin, rfin, per_index_slices(0, len(sizes.varlen), "final conv state of sequence")
    )
    return c.done()


def case_conv_decode(
    fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs
) -> list[Check]:
    """Decode steps on a state pool with a permuted slot map and a padding row; the state each
    step leaves behind is what the next step reads, so a state that is not advanced shows up."""
    c = _Case("causal_conv1d_update", "decode", dn, inp.tolerance_scale)
    B, D, W = sizes.batch, shape.conv_dim, shape.conv_width
    pool = B + 2
    w = _conv_weight(inp, shape)
    state = inp.randn(pool, D, W - 1)
    ref_state = state.clone()
    # Rows map to slots in reverse; an extra padding row (-1) must read and write nothing.
    idx = torch.tensor([*range(pool - 1, pool - 1 - B, -1), -1], dtype=torch.int32, device=inp.device)
    ys, rys = [], []
    for _ in range(sizes.decode_steps):
        x = inp.randn(B + 1, 1, D)
        ys.append(fast.causal_conv1d_update(x, state, w, state_indices=idx))
        rys.append(ref.causal_conv1d_update(x, ref_state, w, state_indices=idx))
    bands = conv_channel_slices(shape.qkv_split, shape.key_dim, shape.value_dim, axis=2)
    c.compare("y (all steps)", torch.cat(ys, 1)[:B], torch.cat(rys, 1)[:B], bands)
    c.compare("padding row y", torch.cat(ys, 1)[B:], torch.cat(rys, 1)[B:])
    c.compare("conv state pool", state, ref_state, per_index_slices(0, pool, "conv state slot"))
    return c.done()


def case_gating(fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs) -> list[Check]:
    c = _Case("gdn_gating", "prefill", dn, inp.tolerance_scale)
    B, T, HV = sizes.batch, sizes.prefill, shape.value_heads
    a, b = inp.randn(B, T, HV), inp.randn(B, T, HV, scale=2.0)
    A_log, dt_bias = inp.gating_params(HV)
    g, beta = fast.gdn_gating(a, b, A_log, dt_bias)
    rg, rbeta = ref.gdn_gating(a, b, A_log, dt_bias)
    heads = per_index_slices(2, HV, "value head")
    c.compare("g", g, rg, heads)
    c.compare("beta", beta, rbeta, heads)
    # A decay must be a decay: exp(g) ≤ 1.  A sign error keeps |g| right and breaks this.
    grows = int((g > 0).sum())
    c.checks.append(
        Check(
            "gdn_gating/prefill g: decays (g ≤ 0)",
            "gdn_gating",
            SUITE,
            grows == 0,
            "positive_log_decays",
            grows,
            0,
            "" if grows == 0 else f"gdn_gating: {grows} log-decays g are positive (the state would grow)",
        )
    )
    return c.done()


def case_l2norm(fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs) -> list[Check]:
    c = _Case("l2norm", "qk", dn, inp.tolerance_scale)
    x = inp.randn(sizes.batch, sizes.prefill, shape.key_heads, shape.key_dim, scale=3.0)
    c.compare("y", fast.l2norm(x), ref.l2norm(x), per_index_slices(2, shape.key_heads, "key head"))
    return c.done()


def _gdn_inputs(
    inp: _Inputs, shape: GdnShape, B: int, T: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return gdn_inputs(
        inp.gen,
        inp.device,
        inp.dtype,
        B=B,
        T=T,
        H=shape.key_heads,
        HV=shape.value_heads,
        K=shape.key_dim,
        V=shape.value_dim,
    )


def case_chunk(fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs) -> list[Check]:
    c = _Case("chunk_gated_delta_rule", "prefill", dn, inp.tolerance_scale)
    B, T = sizes.batch, sizes.prefill
    q, k, v, g, beta = _gdn_inputs(inp, shape, B, T)
    s0 = inp.randn(B, shape.value_heads, shape.key_dim, shape.value_dim, scale=0.5, dtype=torch.float32)
    o, s = fast.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm=True
    )
    ro, rs = ref.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm=True
    )
    assert s is not None and rs is not None
    c.compare("o", o, ro, _head_slices(shape))
    c.compare("final state", s, rs, _state_slices(shape))
    return c.done()


def case_chunk_varlen(
    fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs
) -> list[Check]:
    c = _Case("chunk_gated_delta_rule", "varlen", dn, inp.tolerance_scale)
    total = sum(sizes.varlen)
    q, k, v, g, beta = _gdn_inputs(inp, shape, 1, total)
    cu = _cu(sizes.varlen, inp.device)
    o, s = fast.chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True
    )
    ro, rs = ref.chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True
    )
    assert s is not None and rs is not None
    c.compare("o", o, ro, _head_slices(shape))
    c.compare("final state", s, rs, per_index_slices(0, len(sizes.varlen), "final state of sequence"))
    return c.done()


def case_recurrent(
    fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs
) -> list[Check]:
    """Decode from a carried state through a permuted slot map, several steps in a row."""
    c = _Case("fused_recurrent_gated_delta_rule", "decode", dn, inp.tolerance_scale)
    B, HV, K, V = sizes.batch, shape.value_heads, shape.key_dim, shape.value_dim
    pool = B + 2
    state = inp.randn(pool, HV, K, V, scale=0.5, dtype=torch.float32)
    ref_state = state.clone()
    idx = torch.tensor([*range(pool - 1, pool - 1 - B, -1), -1], dtype=torch.int32, device=inp.device)
    outs, routs = [], []
    for _ in range(sizes.decode_steps):
        q, k, v, g, beta = _gdn_inputs(inp, shape, B + 1, 1)
        kw = {"state_indices": idx, "use_qk_l2norm": True}
        outs.append(fast.fused_recurrent_gated_delta_rule(q, k, v, g, beta, state=state, **kw))  # type: ignore[arg-type]
        routs.append(ref.fused_recurrent_gated_delta_rule(q, k, v, g, beta, state=ref_state, **kw))  # type: ignore[arg-type]
    c.compare("o (all steps)", torch.cat(outs, 1)[:B], torch.cat(routs, 1)[:B], _head_slices(shape))
    c.compare("padding row o", torch.cat(outs, 1)[B:], torch.cat(routs, 1)[B:])
    c.compare("state pool", state, ref_state, _state_slices(shape))
    return c.done()


def case_long_context(
    fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs
) -> list[Check]:
    """A long prefill continuing from a state whose entries exceed the f16 range (|S| up to ~1e5),
    with ordinary q, k, v and slow decay.  Such states are legitimate: near-duplicate keys with
    distant values drive entries towards |Δv| / |Δk| over a long context.  The outputs stay well
    inside f16 (o ≈ scale·Sᵀq ~ 1e4 at most), so an f16 model is fine as long as the state and
    the readout are kept in float32 (DESIGN: the V100 path); an f16 state overflows to inf."""
    c = _Case("chunk_gated_delta_rule", "long-context", dn, inp.tolerance_scale)
    T, HV, K, V = sizes.long, shape.value_heads, shape.key_dim, shape.value_dim
    q, k, v, _, beta = _gdn_inputs(inp, shape, 1, T)
    g = torch.full((1, T, HV), -1e-4, device=inp.device)
    s0 = inp.randn(1, HV, K, V, scale=3e4, dtype=torch.float32)
    o, s = fast.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm=True
    )
    ro, rs = ref.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm=True
    )
    assert s is not None and rs is not None
    c.compare("o", o, ro, _head_slices(shape))
    c.compare("final state", s, rs, _state_slices(shape))
    return c.done()


def case_gated_norm(
    fast: OpSet, ref: OpSet, shape: GdnShape, sizes: Sizes, dn: str, inp: _Inputs
) -> list[Check]:
    c = _Case("gated_rmsnorm", "prefill", dn, inp.tolerance_scale)
    B, T, HV, V = sizes.batch, sizes.prefill, shape.value_heads, shape.value_dim
    x, z = inp.randn(B, T, HV, V, scale=0.3), inp.randn(B, T, HV, V)
    w = inp.randn(V, scale=0.1) + 1.0
    c.compare(
        "y", fast.gated_rmsnorm(x, z, w), ref.gated_rmsnorm(x, z, w), per_index_slices(2, HV, "value head")
    )
    return c.done()


CASES: tuple[Callable[[OpSet, OpSet, GdnShape, Sizes, str, _Inputs], list[Check]], ...] = (
    case_conv,
    case_conv_varlen,
    case_conv_decode,
    case_gating,
    case_l2norm,
    case_chunk,
    case_chunk_varlen,
    case_recurrent,
    case_long_context,
    case_gated_norm,
)


def run_kernels_suite(
    fast: OpSet,
    ref: OpSet,
    shape: GdnShape,
    sizes: Sizes,
    dtype_name: str,
    device: torch.device,
    seed: int = 0,
    tolerance_scale: float = 1.0,
) -> list[Check]:
    checks: list[Check] = []
    for i, case in enumerate(CASES):
        # Every case draws fresh inputs from its own stream: adding a case changes no other case.
        inp = _Inputs(seed * 1000 + i, device, torch_dtype(dtype_name), tolerance_scale)
        started = time.perf_counter()
        try:
            checks.extend(case(fast, ref, shape, sizes, dtype_name, inp))
        except Exception as exc:  # a kernel that raises cannot compute its op: that is a failure
            name = case.__name__.removeprefix("case_")
            checks.append(
                Check(
                    f"{name}: runs",
                    name,
                    SUITE,
                    False,
                    "raised",
                    type(exc).__name__,
                    None,
                    f"{name}: raised {type(exc).__name__}: {str(exc)[:300]}",
                    time.perf_counter() - started,
                )
            )
    return checks
