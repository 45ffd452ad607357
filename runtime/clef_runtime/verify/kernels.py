"""The `kernels` suite: every runtime op against its float64 reference, at the model's head counts
and dims and the deployed dtype, on seeded random inputs, through every path of the op contract.

Each case runs its ops through `harness.Case` (reference on a snapshot of the inputs, inputs
checked unchanged, results re-checked after a second call) and produces, per output tensor, two
error checks (``rel_rms``, ``rel_max`` of the worst value head / state block / conv head, against
`clef_runtime.tolerances`) and one coverage check (no band, head or state slice
dead in the candidate but alive in the reference).  Decode cases chain several calls through one
state pool, so a kernel that corrupts state it hands on is caught where the next call reads it.
The paths: batched and packed (varlen) prefill, packed with per-sequence initial states and a
zero-length sequence, decode with 1, 2 and 4 tokens per row through a permuted pool with a padding
row, one decode step of the conv update and the delta rule at 256 rows, every launch configuration the kernels' choosers select here (`configs`), gate
pre-activations on both sides of softplus's branch points, strong in-chunk decays, a long context
whose large final state decode continues, and near-zero rows for the norms.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from clef_runtime.dtypes import torch_dtype
from clef_runtime.inputs import gdn_inputs
from clef_runtime.opset import OpSet
from clef_runtime.verify import configs
from clef_runtime.verify.coverage import Slice, conv_channel_slices, per_index_slices
from clef_runtime.verify.harness import SUITE, Case, Inputs
from clef_runtime.verify.report import Check


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

    @property
    def conv_group(self) -> int:
        """Channels per conv error group: divides every q, k and v head."""
        return math.gcd(self.key_dim, self.value_dim)


@dataclass(frozen=True)
class Sizes:
    """Token counts: large enough to cross chunk boundaries, small enough for the budget."""

    batch: int
    prefill: int  # tokens per sequence in the batched cases (not a multiple of the chunk)
    varlen: tuple[int, ...]  # packed sequence lengths (includes 1 and a non-multiple of 64)
    varlen_init: tuple[int, ...]  # packed lengths continuing from initial states (includes 0)
    decode_tokens: tuple[int, ...]  # tokens per row of the successive decode calls
    long: int  # tokens of the long-context case (state growth, f16 range)
    decode_batch: int  # rows of the large-batch decode step (an engine's decode batch)


MODEL_SIZES = Sizes(
    batch=2, prefill=1000, varlen=(1, 63, 300, 701), varlen_init=(0, 1, 130, 517), decode_tokens=(1, 2, 4),
    long=4096, decode_batch=256,
)  # fmt: skip
# the CPU tier's interpreter runs every program of a launch one by one: a few rows keep the
# large-batch case's code tested there at the cost of the small decode case
REDUCED_SIZES = Sizes(
    batch=2, prefill=70, varlen=(1, 13, 66), varlen_init=(0, 3, 20), decode_tokens=(1, 2, 4), long=160,
    decode_batch=3,
)  # fmt: skip


@dataclass
class Run:
    """What every case of one suite run shares: the op sets, the dtype, the tolerance scale and
    the ops already re-checked by a second call (`harness`)."""

    fast: OpSet
    ref: OpSet
    dtype_name: str
    scale: float = 1.0
    rechecked: set[str] = field(default_factory=set)

    def case(self, op: str, name: str) -> Case:
        return Case(op, name, self.dtype_name, self.fast, self.ref, self.scale, self.rechecked)


CaseFn = Callable[[Run, GdnShape, Sizes, Inputs], list[Check]]


def _cu(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _pool_rows(rows: int, device: torch.device) -> tuple[int, torch.Tensor]:
    """A pool of rows + 2 slots; rows map to slots in reverse, plus a padding row (-1) that must
    read and write nothing."""
    pool = rows + 2
    idx = [*range(pool - 1, pool - 1 - rows, -1), -1]
    return pool, torch.tensor(idx, dtype=torch.int32, device=device)


# ---- error groups and coverage slices ---------------------------------------------------------


def _value_head(i: int) -> str:
    return f"value head {i}"


def _state_block(heads: int, what: str = "sequence") -> Callable[[int], str]:
    return lambda i: f"{what} {i // heads} value head {i % heads}"


def _conv_groups(shape: GdnShape) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[int], str]]:
    """Conv outputs ``[..., D]`` regrouped to ``[..., D / h, h]`` (h divides every head)."""
    h = shape.conv_group
    nq, nk, _ = shape.qkv_split

    def name(i: int) -> str:
        lo = i * h
        band = "query" if lo < nq else "key" if lo < nq + nk else "value"
        return f"channels [{lo}, {lo + h}) ({band} band)"

    return (lambda t: t.reshape(*t.shape[:-1], -1, h)), name


def _conv_state_groups(
    shape: GdnShape, what: str
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[int], str]]:
    """Conv states ``[N, D, W - 1]`` regrouped to ``[N, D / h, h, W - 1]``, a group per (n, head)."""
    h, per = shape.conv_group, shape.conv_dim // shape.conv_group
    return (lambda t: t.reshape(t.shape[0], per, h, t.shape[-1])), (
        lambda i: f"{what} {i // per} channels [{(i % per) * h}, {(i % per + 1) * h})"
    )


def _bands(shape: GdnShape, axis: int) -> list[Slice]:
    return conv_channel_slices(shape.qkv_split, shape.key_dim, shape.value_dim, axis=axis)


def _heads(shape: GdnShape) -> list[Slice]:
    return per_index_slices(2, shape.value_heads, "output of value head")  # [B, T, HV, V]


def _state_slices(shape: GdnShape) -> list[Slice]:
    return per_index_slices(1, shape.value_heads, "state of value head")  # [N, HV, K, V]


# ---- conv -------------------------------------------------------------------------------------


def _conv_weight(inp: Inputs, shape: GdnShape) -> torch.Tensor:
    return inp.randn(shape.conv_dim, shape.conv_width, scale=shape.conv_width**-0.5)


def _conv_prefill(
    c: Case, shape: GdnShape, inp: Inputs, x: torch.Tensor, lengths: Sequence[int] | None, init: bool
) -> None:
    D, W = shape.conv_dim, shape.conv_width
    N = x.shape[0] if lengths is None else len(lengths)
    kw: dict[str, object] = {"x": x, "weight": _conv_weight(inp, shape), "output_final_state": True}
    if lengths is not None:
        kw["cu_seqlens"] = _cu(lengths, inp.device)
    if init:
        kw["initial_state"] = inp.randn(N, D, W - 1)
    (y, fin), (ry, rfin) = c.run("causal_conv1d", **kw)
    regroup, name = _conv_groups(shape)
    c.compare("y", y, ry, _bands(shape, 2), (-2,), name, regroup=regroup)
    sregroup, sname = _conv_state_groups(shape, "sequence")
    c.compare("final conv state", fin, rfin, per_index_slices(0, N, "final conv state of sequence"), (0, 1),
              sname, regroup=sregroup)  # fmt: skip


def case_conv(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("causal_conv1d", "prefill")
    _conv_prefill(c, shape, inp, inp.randn(sizes.batch, sizes.prefill, shape.conv_dim), None, init=True)
    return c.done()


def case_conv_varlen(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("causal_conv1d", "varlen")
    _conv_prefill(c, shape, inp, inp.randn(1, sum(sizes.varlen), shape.conv_dim), sizes.varlen, init=False)
    return c.done()


def case_conv_varlen_init(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Packed sequences continuing from per-sequence initial states (chunked prefill, prefix
    caching), one of them empty: its final state is its initial state."""
    c = run.case("causal_conv1d", "varlen-initial-states")
    x = inp.randn(1, sum(sizes.varlen_init), shape.conv_dim)
    _conv_prefill(c, shape, inp, x, sizes.varlen_init, init=True)
    return c.done()


def case_conv_configs(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """A short prefill for every tile choice of the conv that the other cases' lengths miss."""
    c = run.case("causal_conv1d", "launch-configs")
    lengths = (sizes.prefill, *sizes.varlen, *sizes.varlen_init)
    picks = configs.conv_prefill_tokens(shape.conv_dim, lengths)
    ys, fins = [], []
    for label, T in picks.items():
        kw = {"x": inp.randn(sizes.batch, T, shape.conv_dim), "weight": _conv_weight(inp, shape)}
        kw["initial_state"] = inp.randn(sizes.batch, shape.conv_dim, shape.conv_width - 1)
        (y, fin), (ry, rfin) = c.run("causal_conv1d", output_final_state=True, **kw)
        ys.append((f"{label} (T={T})", y, ry))
        fins.append((f"{label} (T={T})", fin, rfin))
    regroup, name = _conv_groups(shape)
    c.compare_parts("y", ys, _bands(shape, 2), (-2,), name, regroup=regroup)
    c.compare_parts("final conv state", fins)
    return c.done()


def case_conv_decode(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Decode calls of 1, 2 and 4 tokens per row on a state pool with a permuted slot map and a
    padding row; the state each call leaves behind is what the next reads, so a state that is not
    advanced shows up.  The kernel's launch shape depends on the channel count only: this case and
    the large-batch one run it."""
    c = run.case("causal_conv1d_update", "decode")
    D, W = shape.conv_dim, shape.conv_width
    plan = [(sizes.batch, sizes.decode_tokens)]  # (rows, tokens per call)
    regroup, name = _conv_groups(shape)
    ys, pads, pools = [], [], []
    for B, calls in plan:
        pool, idx = _pool_rows(B, inp.device)
        w = _conv_weight(inp, shape)
        state = inp.randn(pool, D, W - 1)
        ref_state = state.clone()
        for T in calls:
            y, ry = c.run(
                "causal_conv1d_update", ref_inplace={"conv_state": ref_state},
                x=inp.randn(B + 1, T, D), conv_state=state, weight=w, state_indices=idx,
            )  # fmt: skip
            ys.append((f"B={B} T={T}", y[:B], ry[:B]))
            pads.append((f"B={B} T={T}", y[B:], ry[B:]))
        pools.append((f"B={B}", state, ref_state))
    c.compare_parts("y", ys, _bands(shape, 2), (-2,), name, regroup=regroup)
    c.compare_parts("padding row y", pads)
    sregroup, sname = _conv_state_groups(shape, "slot")
    c.compare_parts("conv state pool", pools, (), (0, 1), sname, regroup=sregroup)
    return c.done()


# ---- gating and the row-wise norms -------------------------------------------------------------


def _gating(
    c: Case, what: str, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> None:
    (g, beta), (rg, rbeta) = c.run("gdn_gating", a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    heads = per_index_slices(g.dim() - 1, g.shape[-1], "value head")
    c.compare(f"g{what}", g, rg, heads, (-1,), _value_head)
    c.compare(f"beta{what}", beta, rbeta, heads, (-1,), _value_head)
    grows = int((g > 0).sum())
    # A decay must be a decay: exp(g) ≤ 1.  A sign error keeps |g| right and breaks this.
    c.flag(f"g{what}: decays (g ≤ 0)", "positive_log_decays",
           [f"gdn_gating: {grows} log-decays g are positive (the state would grow)"] if grows else [])  # fmt: skip


def case_gating(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("gdn_gating", "prefill")
    B, T, HV = sizes.batch, sizes.prefill, shape.value_heads
    a, b = inp.randn(B, T, HV), inp.randn(B, T, HV, scale=2.0)
    _gating(c, "", a, b, *inp.gating_params(HV))
    return c.done()


def softplus_points() -> torch.Tensor:
    """Pre-activations x = a + dt_bias on both sides of every branch point of a softplus: 0 (the
    max), ±ln 8 (where log1p(e^-|x|) switches from the log to a series), ±20 (where libraries
    return x itself), spread over [-40, 40] and dense around each point."""
    pts = [torch.linspace(-40.0, 40.0, 161)]
    for p in (0.0, math.log(8.0), -math.log(8.0), 20.0, -20.0):
        pts.append(p + torch.tensor([-1e-1, -1e-2, -1e-3, -1e-5, 0.0, 1e-5, 1e-3, 1e-2, 1e-1]))
    return torch.cat(pts)


def case_gating_regimes(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Gate pre-activations across softplus's branch points (and β's logits far into both tails)."""
    c = run.case("gdn_gating", "softplus-regimes")
    HV = shape.value_heads
    A_log, dt_bias = inp.gating_params(HV)
    x = softplus_points()
    cols = [x.roll(3 * h) for h in range(HV)]  # each head sees every point, at other rows
    x2 = torch.stack(cols, -1).to(inp.device)
    a = (x2 - dt_bias).to(inp.dtype).unsqueeze(0).contiguous()
    b = x2.flip(0).to(inp.dtype).unsqueeze(0).contiguous()
    _gating(c, "", a, b, A_log, dt_bias)
    return c.done()


def _row_configs(
    c: Case, op: str, width: int, covered: Sequence[int], make: Callable[[int], dict[str, torch.Tensor]]
) -> list[tuple[str, Any, Any]]:
    out = []
    for label, M in configs.row_tile_rows(width, covered).items():
        y, ry = c.run(op, **make(M))
        out.append((f"{label} (rows={M})", y, ry))
    return out


def case_rowwise_configs(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """The row-wise ops (gating, l2norm, gated norm) at every tile choice of `row_tile` that the
    prefill cases' row counts miss."""
    rows = sizes.batch * sizes.prefill
    HV, K, V = shape.value_heads, shape.key_dim, shape.value_dim
    checks: list[Check] = []
    gc = run.case("gdn_gating", "launch-configs")
    A_log, dt_bias = inp.gating_params(HV)
    parts = _row_configs(gc, "gdn_gating", HV, [rows, softplus_points().numel()],
                         lambda m: {"a": inp.randn(m, HV), "b": inp.randn(m, HV), "A_log": A_log, "dt_bias": dt_bias})  # fmt: skip
    gc.compare_parts("g", [(lbl, y[0], r[0]) for lbl, y, r in parts], groups=(-1,), group_name=_value_head)
    gc.compare_parts("beta", [(lbl, y[1], r[1]) for lbl, y, r in parts], groups=(-1,), group_name=_value_head)
    checks += gc.done()
    lc = run.case("l2norm", "launch-configs")
    parts = _row_configs(
        lc, "l2norm", K, [rows * shape.key_heads], lambda m: {"x": inp.randn(m, K, scale=3.0)}
    )
    lc.compare_parts("y", parts)
    checks += lc.done()
    nc = run.case("gated_rmsnorm", "launch-configs")
    w = inp.randn(V, scale=0.1) + 1.0
    parts = _row_configs(nc, "gated_rmsnorm", V, [rows * HV],
                         lambda m: {"x": inp.randn(m, V, scale=0.3), "z": inp.randn(m, V), "weight": w})  # fmt: skip
    nc.compare_parts("y", parts)
    return checks + nc.done()


def _near_zero_rows(inp: Inputs, B: int, T: int, heads: int, dim: int, scale: float) -> torch.Tensor:
    """Rows of ordinary size with every eighth row scaled towards zero (down to exactly zero):
    where ``sum(x²)`` meets the norm's eps."""
    x = torch.randn(B, T, heads, dim, generator=inp.gen) * scale
    tiny = torch.tensor([0.0, 1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    x[:, ::8] *= tiny[torch.arange(x[:, ::8].shape[1]) % len(tiny)][None, :, None, None] / scale
    return x.to(device=inp.device, dtype=inp.dtype)


def case_l2norm(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("l2norm", "qk")
    x = _near_zero_rows(inp, sizes.batch, sizes.prefill, shape.key_heads, shape.key_dim, 3.0)
    y, ry = c.run("l2norm", x=x)
    c.compare("y", y, ry, per_index_slices(2, shape.key_heads, "key head"), (2,), lambda i: f"key head {i}")
    return c.done()


def case_gated_norm(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("gated_rmsnorm", "prefill")
    B, T, HV, V = sizes.batch, sizes.prefill, shape.value_heads, shape.value_dim
    x, z = _near_zero_rows(inp, B, T, HV, V, 0.3), inp.randn(B, T, HV, V)
    w = inp.randn(V, scale=0.1) + 1.0
    y, ry = c.run("gated_rmsnorm", x=x, z=z, weight=w)
    c.compare("y", y, ry, per_index_slices(2, HV, "value head"), (2,), _value_head)
    return c.done()


# ---- the delta rule ----------------------------------------------------------------------------


def _gdn(inp: Inputs, shape: GdnShape, B: int, T: int) -> dict[str, torch.Tensor]:
    q, k, v, g, beta = gdn_inputs(
        inp.gen, inp.device, inp.dtype, B=B, T=T, H=shape.key_heads, HV=shape.value_heads,
        K=shape.key_dim, V=shape.value_dim,
    )  # fmt: skip
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


def _state(inp: Inputs, shape: GdnShape, n: int, scale: float) -> torch.Tensor:
    return inp.randn(n, shape.value_heads, shape.key_dim, shape.value_dim, scale=scale, dtype=torch.float32)


def _chunk(
    c: Case, shape: GdnShape, kw: dict[str, torch.Tensor], n: int, what: str = "sequence"
) -> tuple[torch.Tensor, torch.Tensor]:
    (o, s), (ro, rs) = c.run("chunk_gated_delta_rule", output_final_state=True, use_qk_l2norm=True, **kw)
    c.compare("o", o, ro, _heads(shape), (2,), _value_head)
    slices = per_index_slices(0, n, f"final state of {what}") if n > 1 else _state_slices(shape)
    c.compare("final state", s, rs, slices, (0, 1), _state_block(shape.value_heads, what))
    return s, rs


def case_chunk(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("chunk_gated_delta_rule", "prefill")
    kw = _gdn(inp, shape, sizes.batch, sizes.prefill)
    _chunk(c, shape, {**kw, "initial_state": _state(inp, shape, sizes.batch, 0.5)}, sizes.batch)
    return c.done()


def case_chunk_varlen(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    c = run.case("chunk_gated_delta_rule", "varlen")
    kw = _gdn(inp, shape, 1, sum(sizes.varlen))
    _chunk(c, shape, {**kw, "cu_seqlens": _cu(sizes.varlen, inp.device)}, len(sizes.varlen))
    return c.done()


def case_chunk_varlen_init(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Packed sequences continuing from per-sequence states, one of them empty."""
    c = run.case("chunk_gated_delta_rule", "varlen-initial-states")
    n = len(sizes.varlen_init)
    kw = _gdn(inp, shape, 1, sum(sizes.varlen_init))
    kw |= {"cu_seqlens": _cu(sizes.varlen_init, inp.device), "initial_state": _state(inp, shape, n, 0.5)}
    _chunk(c, shape, kw, n)
    return c.done()


def case_chunk_short(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Prompts of 1, 2 and 3 tokens, each alone from a state: a chunk that is almost all padding.
    A one-token bf16 prompt once faulted on the H200 (Triton compiled T = 1 as a constant and the
    pipelined chunk loop with it), a shape the longer cases never reach."""
    c = run.case("chunk_gated_delta_rule", "short-prompts")
    outs, finals = [], []
    for T in (1, 2, 3):
        kw = {**_gdn(inp, shape, 1, T), "initial_state": _state(inp, shape, 1, 0.5)}
        (o, s), (ro, rs) = c.run("chunk_gated_delta_rule", output_final_state=True, use_qk_l2norm=True, **kw)
        outs.append((f"T={T}", o, ro))
        finals.append((f"T={T}", s, rs))
    c.compare_parts("o", outs, _heads(shape), (2,), _value_head)
    c.compare_parts(
        "final state", finals, _state_slices(shape), (0, 1), _state_block(shape.value_heads, "sequence")
    )
    return c.done()


def case_chunk_strong_decay(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Per-token log-decays from -0.01 to -16 across heads: the in-chunk cumulative decay reaches
    -1000, where e^G underflows float32 and its differences must be formed before exp."""
    c = run.case("chunk_gated_delta_rule", "strong-decay")
    kw = _gdn(inp, shape, 1, sizes.prefill)
    HV = shape.value_heads
    rate = torch.logspace(-2, math.log10(16.0), HV)
    kw["g"] = (-rate * torch.rand(1, sizes.prefill, HV, generator=inp.gen) * 2).to(inp.device).contiguous()
    _chunk(c, shape, {**kw, "initial_state": _state(inp, shape, 1, 0.5)}, 1)
    return c.done()


def case_long_context(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """A long prefill continuing from a state whose entries exceed the f16 range (|S| up to ~1e5),
    with slow decay and keys confined to the first half of the key dims, so that the large rows
    of the state are never overwritten and the *final* state is as large; then decode (1 and 2
    tokens, ordinary keys) continuing from it.  Such states are legitimate: near-duplicate keys
    with distant values drive entries towards |Δv| / |Δk| over a long context.  The outputs stay
    inside f16 (o ≈ scale·Sᵀq, a few 1e3), so an f16 model is fine as long as the state and the
    readout are kept in float32 (DESIGN: the V100 path); a state stored through f16 overflows."""
    c = run.case("chunk_gated_delta_rule", "long-context")
    kw = _gdn(inp, shape, 1, sizes.long)
    kw["g"] = torch.full((1, sizes.long, shape.value_heads), -1e-4, device=inp.device)
    kw["k"][..., shape.key_dim // 2 :] = 0
    s, rs = _chunk(c, shape, {**kw, "initial_state": _state(inp, shape, 1, 3e4)}, 1)
    checks = c.done()
    d = run.case("fused_recurrent_gated_delta_rule", "decode-after-long-context")
    outs = []
    # both continue from the candidate's final state: this case judges decode, the one above the
    # prefill that produced it
    del rs
    state, ref_state = s.clone(), s.clone()
    for T in (1, 2):
        o, ro = d.run("fused_recurrent_gated_delta_rule", ref_inplace={"state": ref_state},
                      state=state, use_qk_l2norm=True, **_gdn(inp, shape, 1, T))  # fmt: skip
        outs.append((f"T={T}", o, ro))
    d.compare_parts("o", outs, _heads(shape), (2,), _value_head)
    d.compare(
        "state",
        state,
        ref_state,
        _state_slices(shape),
        (0, 1),
        _state_block(shape.value_heads),
    )
    return checks + d.done()


def case_recurrent(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """Decode calls of 1, 2 and 4 tokens per row from a carried state through a permuted slot
    map with a padding row."""
    c = run.case("fused_recurrent_gated_delta_rule", "decode")
    B = sizes.batch
    pool, idx = _pool_rows(B, inp.device)
    state = _state(inp, shape, pool, 0.5)
    ref_state = state.clone()
    outs, pads = [], []
    for T in sizes.decode_tokens:
        o, ro = c.run("fused_recurrent_gated_delta_rule", ref_inplace={"state": ref_state}, state=state,
                      state_indices=idx, use_qk_l2norm=True, **_gdn(inp, shape, B + 1, T))  # fmt: skip
        outs.append((f"T={T}", o[:B], ro[:B]))
        pads.append((f"T={T}", o[B:], ro[B:]))
    c.compare_parts("o", outs, _heads(shape), (2,), _value_head)
    c.compare_parts("padding row o", pads)
    c.compare("state pool", state, ref_state, _state_slices(shape), (0, 1),
              _state_block(shape.value_heads, "slot"))  # fmt: skip
    return c.done()


def case_decode_large_batch(run: Run, shape: GdnShape, sizes: Sizes, inp: Inputs) -> list[Check]:
    """One decode step of the conv update and of the delta rule at an engine's decode batch
    (`Sizes.decode_batch` rows, 256 at the model's sizes) through a permuted pool with a padding
    row: a fault that breaks only large batches (a grid dimension, a row or slot offset that
    overflows, a tile choice made by the batch size) shows up here and nowhere else."""
    B = sizes.decode_batch
    pool, idx = _pool_rows(B, inp.device)
    c = run.case("causal_conv1d_update", "decode-large-batch")
    D, W = shape.conv_dim, shape.conv_width
    conv_state = inp.randn(pool, D, W - 1)
    ref_conv_state = conv_state.clone()
    y, ry = c.run(
        "causal_conv1d_update", ref_inplace={"conv_state": ref_conv_state},
        x=inp.randn(B + 1, 1, D), conv_state=conv_state, weight=_conv_weight(inp, shape), state_indices=idx,
    )  # fmt: skip
    regroup, name = _conv_groups(shape)
    c.compare(f"y (B={B})", y[:B], ry[:B], _bands(shape, 2), (-2,), name, regroup=regroup)
    c.compare(f"padding row y (B={B})", y[B:], ry[B:])
    sregroup, sname = _conv_state_groups(shape, "slot")
    c.compare(f"conv state pool (B={B})", conv_state, ref_conv_state, (), (0, 1), sname, regroup=sregroup)
    d = run.case("fused_recurrent_gated_delta_rule", "decode-large-batch")
    state = _state(inp, shape, pool, 0.5)
    ref_state = state.clone()
    o, ro = d.run("fused_recurrent_gated_delta_rule", ref_inplace={"state": ref_state}, state=state,
                  state_indices=idx, use_qk_l2norm=True, **_gdn(inp, shape, B + 1, 1))  # fmt: skip
    d.compare(f"o (B={B})", o[:B], ro[:B], _heads(shape), (2,), _value_head)
    d.compare(f"padding row o (B={B})", o[B:], ro[B:])
    d.compare(f"state pool (B={B})", state, ref_state, _state_slices(shape), (0, 1),
              _state_block(shape.value_heads, "slot"))  # fmt: skip
    return c.done() + d.done()


CASES: tuple[CaseFn, ...] = (
    case_conv,
    case_conv_varlen,
    case_conv_varlen_init,
    case_conv_configs,
    case_conv_decode,
    case_gating,
    case_gating_regimes,
    case_l2norm,
    case_gated_norm,
    case_rowwise_configs,
    case_chunk,
    case_chunk_varlen,
    case_chunk_varlen_init,
    case_chunk_strong_decay,
    case_long_context,
    case_recurrent,
    case_chunk_short,  # appended: a case's inputs come from its index's stream
    case_decode_large_batch,
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
    run = Run(fast, ref, dtype_name, tolerance_scale)
    for i, case in enumerate(CASES):
        # Every case draws fresh inputs from its own stream: adding a case changes no other case.
        inp = Inputs(seed * 1000 + i, device, torch_dtype(dtype_name))
        started = time.perf_counter()
        try:
            checks.extend(case(run, shape, sizes, inp))
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
