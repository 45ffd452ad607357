"""The benchmark rows: for each, its shapes, fresh random inputs, clef's call, FLA's call in clef's
layouts (`clef_runtime.bench.fla_peer`) and its byte/FLOP floor (`clef_runtime.bench.floors`).

An input *set* is a dict of tensors in clef's layouts, drawn from a seed.  ``Impl.prepare`` maps a
set to what an implementation needs (FLA's conv cache layout, say) outside the timed region;
``Impl.run`` is the timed call and returns its outputs in clef's layouts (as views, never
copies), so that the two implementations can be compared key by key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import torch
import torch.nn.functional as F

from clef_runtime.bench.fla_peer import FlaPeer
from clef_runtime.bench.floors import (
    Dims,
    Floor,
    chunk_floor,
    conv_floor,
    conv_update_floor,
    gated_rmsnorm_floor,
    gating_floor,
    l2norm_floor,
    layer_core_floor,
    layer_decode_floor,
    recurrent_floor,
)
from clef_runtime.inputs import gdn_inputs
from clef_runtime.opset import OpSet

Tensors = dict[str, torch.Tensor]
EPS = 1e-6


def _identity(s: Tensors) -> Tensors:
    return s


@dataclass
class Impl:
    name: str
    run: Callable[[Tensors], Tensors]
    prepare: Callable[[Tensors], Tensors] = _identity


@dataclass
class Setup:
    """What a row needs at run time.  ``shared_bytes``: bytes every call reads from tensors shared
    by all sets (a layer's weights), for sizing the rotation.  ``peers``: implementations timed
    beside clef and FLA (FlashQLA, clef's split chunk design), checked against FLA (or clef when
    there is no FLA); ``peer_missing``: the peers a row would have, with why they are absent."""

    case: str
    floor: Floor
    make_set: Callable[[int], Tensors]
    clef: Impl
    fla: Impl | None
    fla_missing: str | None
    notes: list[str] = field(default_factory=list)
    fla_notes: list[str] = field(default_factory=list)  # how FLA was called; shown when FLA is loaded
    shared_bytes: int = 0
    show_tflops: bool = False
    peers: list[Impl] = field(default_factory=list)
    peer_missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    device: torch.device
    dtype: torch.dtype
    dims: Dims
    ops: OpSet
    fla: FlaPeer | None
    fla_reason: str = ""
    flashqla: Callable[..., object] | None = None
    flashqla_reason: str = "not loaded"
    split: bool = False  # also time clef's split chunk design (`clef_runtime.ops.delta_rule_chunk_split`)
    # chunk rows: q/k normalised inside the op (as the model calls it); False: they arrive
    # normalised and no implementation normalises them
    qk_l2norm: bool = True
    fla_backend: str = ""  # which backend FLA's chunked call runs (`fla_peer.fla_chunk_backend`)

    @property
    def elt(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Row:
    """``full``/``tiny``: (B, T) at the model's shapes and at the --allow-cpu shapes."""

    name: str
    op: str
    graph: bool
    full: tuple[int, int]
    tiny: tuple[int, int]
    build: Callable[[Context, int, int], Setup]


class Draw:
    """Seeded random tensors drawn on the device (float32, then cast)."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def normal(
        self, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0, mean: float = 0.0
    ) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (t * scale + mean).to(dtype)

    def uniform(self, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        t = torch.rand(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return t * (hi - lo) + lo


def _fla(
    ctx: Context, names: tuple[str, ...], make: Callable[[FlaPeer], Impl]
) -> tuple[Impl | None, str | None]:
    if ctx.fla is None:
        return None, ctx.fla_reason or "FLA not loaded"
    why = ctx.fla.why_missing(*names)
    if why is not None:
        return None, why
    return make(ctx.fla), None


def _some(t: torch.Tensor | None, what: str) -> torch.Tensor:
    if t is None:
        raise RuntimeError(f"{what} returned no tensor where one was asked for")
    return t


def _gdn_set(r: Draw, d: Dims, B: int, T: int, dtype: torch.dtype, normalise_qk: bool = False) -> Tensors:
    """q, k, v, g, beta as `clef_runtime.inputs.gdn_inputs` draws them (on the device)."""
    q, k, v, g, beta = gdn_inputs(
        r.gen, r.device, dtype, B=B, T=T, H=d.H, HV=d.HV, K=d.K, V=d.V, normalise_qk=normalise_qk
    )
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


# ---- chunked delta rule (prefill) ---------------------------------------------------------------


FLASHQLA = "flashqla"
SPLIT = "clef-split"


def _chunk(ctx: Context, B: int, T: int, seqs: int = 0) -> Setup:
    """``seqs`` > 0: B must be 1 and the T tokens are ``seqs`` packed sequences of T / seqs."""
    d, dt = ctx.dims, ctx.dtype
    N = seqs or B
    # One offsets tensor for every input set, as a model's GDN layers share their batch's: FLA and
    # FlashQLA cache what they read from it on the host (by tensor identity), so after the first
    # call they no longer sync with the host, and the row can be timed by graph replay like the
    # dense ones (offsets of their own per set made every call sync: host-bound, launch overhead
    # timed).  clef takes int32 offsets, FLA and FlashQLA int64 (int32 faulted in FlashQLA or FLA).
    offsets: Tensors = {}
    if seqs:
        offsets["cu_seqlens"] = torch.arange(0, T + 1, T // seqs, dtype=torch.int32, device=ctx.device)
        offsets["cu_seqlens64"] = offsets["cu_seqlens"].long()

    def make_set(seed: int) -> Tensors:
        return {**_gdn_set(Draw(ctx.device, seed), d, B, T, dt, normalise_qk=not ctx.qk_l2norm), **offsets}

    def call(fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], what: str, **kw: object) -> Impl:
        cu_key = "cu_seqlens" if what.startswith("clef") else "cu_seqlens64"

        def run(s: Tensors) -> Tensors:
            o, final = fn(s["q"], s["k"], s["v"], s["g"], s["beta"], cu_seqlens=s.get(cu_key),
                          output_final_state=True, **kw)  # fmt: skip
            return {"o": o, "final_state": _some(final, what)}

        return Impl(what, run)

    norm = ctx.qk_l2norm
    impl, why = _fla(ctx, ("chunk",), lambda p: call(p.get("chunk"), "fla", use_qk_l2norm_in_kernel=norm))
    peers: list[Impl] = []
    missing: dict[str, str] = {}
    if ctx.flashqla is not None:
        peers.append(call(ctx.flashqla, FLASHQLA, use_qk_l2norm_in_kernel=norm))  # type: ignore[arg-type]
    else:
        missing[FLASHQLA] = ctx.flashqla_reason
    if ctx.split:
        from clef_runtime.ops.delta_rule_chunk_split import chunk_gated_delta_rule_split

        peers.append(call(chunk_gated_delta_rule_split, SPLIT, use_qk_l2norm=norm))
    case = f"{seqs} packed × {T // seqs}" if seqs else f"B{B} T{T}"
    return Setup(
        case=case,
        floor=chunk_floor(d, B, T, ctx.elt, states=N),
        make_set=make_set,
        clef=call(ctx.ops.chunk_gated_delta_rule, "clef", use_qk_l2norm=norm),
        fla=impl,
        fla_missing=why,
        notes=[
            (
                "q/k L2-normalised inside the op (as the model calls it)"
                if norm
                else "q/k arrive L2-normalised; no implementation normalises them (--no-qk-l2norm)"
            )
            + "; no initial state, final state written"
        ],
        fla_notes=[
            "FLA chunk: same layouts, HV = 2·H natively (no q/k repeat)"
            + (
                "; use_qk_l2norm_in_kernel runs a separate l2norm pass over q and k (more bytes than the floor)"
                if norm
                else ""
            ),
            f"FLA's chunked call ran {ctx.fla_backend or 'FLA: backend unknown'}",
        ],
        show_tflops=True,
        peers=peers,
        peer_missing=missing,
    )


def _chunk_packed(ctx: Context, B: int, T: int) -> Setup:
    return _chunk(ctx, 1, T, seqs=8)


# ---- recurrent delta rule (decode) --------------------------------------------------------------


def _recurrent(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {**_gdn_set(r, d, B, T, dt), "state": r.normal((B, d.HV, d.K, d.V), torch.float32, scale=0.1)}

    def clef(s: Tensors) -> Tensors:
        o = ctx.ops.fused_recurrent_gated_delta_rule(
            s["q"], s["k"], s["v"], s["g"], s["beta"], state=s["state"], use_qk_l2norm=True
        )
        return {"o": o, "state": s["state"]}

    def fla(p: FlaPeer) -> Impl:
        fn = p.get("recurrent")

        def run(s: Tensors) -> Tensors:
            o, final = fn(
                s["q"],
                s["k"],
                s["v"],
                g=s["g"],
                beta=s["beta"],
                initial_state=s["state"],
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            return {"o": o, "state": final}

        return Impl("fla", run)

    impl, why = _fla(ctx, ("recurrent",), fla)
    return Setup(
        case=f"B{B}" + (f" T{T}" if T != 1 else ""),
        floor=recurrent_floor(d, B, ctx.elt, T),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        notes=["state updated in place"],
        fla_notes=["FLA fused_recurrent: same layouts; reads the state and writes a new one (same bytes)"],
    )


# ---- causal conv ----------------------------------------------------------------------------------


def _conv(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {"x": r.normal((B, T, d.D), dt), "weight": r.normal((d.D, d.W), dt, scale=d.W**-0.5)}

    def clef(s: Tensors) -> Tensors:
        y, final = ctx.ops.causal_conv1d(s["x"], s["weight"], activation="silu", output_final_state=True)
        return {"y": y, "final_state": _some(final, "causal_conv1d")}

    def fla(p: FlaPeer) -> Impl:
        fn = p.get("conv")

        def run(s: Tensors) -> Tensors:
            y, final = fn(
                x=s["x"], weight=s["weight"], activation="silu", output_final_state=True, backend="triton"
            )
            return {"y": y, "final_state": final[..., 1:]}  # FLA keeps W inputs, clef W - 1

        return Impl("fla", run)

    impl, why = _fla(ctx, ("conv",), fla)
    return Setup(
        case=f"B{B} T{T} D{d.D} W{d.W}",
        floor=conv_floor(d, B, T, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        notes=["silu, final conv state written"],
        fla_notes=["FLA conv: final state is [N, D, W] (clef's [N, D, W-1] is its [..., 1:])"],
    )


def _fla_cache(s: Tensors) -> Tensors:
    """FLA's decode conv cache ``[B, D, W]`` from clef's ``[B, D, W - 1]`` state: FLA reads columns
    1..W-1 and shifts; column 0 is never read (a copy of the oldest input stands in)."""
    st = s["state"]
    return {**s, "cache": torch.cat([st[..., :1], st], dim=-1).contiguous()}


def _conv_update(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {
            "x": r.normal((B, T, d.D), dt),
            "state": r.normal((B, d.D, d.W - 1), dt),
            "weight": r.normal((d.D, d.W), dt, scale=d.W**-0.5),
        }

    def clef(s: Tensors) -> Tensors:
        y = ctx.ops.causal_conv1d_update(s["x"], s["state"], s["weight"], activation="silu")
        return {"y": y, "state": s["state"]}

    def fla(p: FlaPeer) -> Impl:
        fn = p.get("conv_update")

        def run(s: Tensors) -> Tensors:
            y, cache = fn(x=s["x"], cache=s["cache"], weight=s["weight"], activation="silu")
            return {"y": y, "state": cache[..., 1:]}

        return Impl("fla", run, prepare=_fla_cache)

    impl, why = _fla(ctx, ("conv_update",), fla)
    return Setup(
        case=f"B{B} D{d.D} W{d.W}",
        floor=conv_update_floor(d, B, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        notes=["conv state updated in place"],
        fla_notes=[
            "FLA conv update: cache [B, D, W] built from clef's [B, D, W-1] outside the timed region; writes W columns"
        ],
    )


# ---- norms and gating -----------------------------------------------------------------------------


def _gated_rmsnorm(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {
            "x": r.normal((B * T, d.HV, d.V), dt),
            "z": r.normal((B * T, d.HV, d.V), dt),
            "weight": r.normal((d.V,), dt, scale=0.1, mean=1.0),
        }

    def clef(s: Tensors) -> Tensors:
        return {"y": ctx.ops.gated_rmsnorm(s["x"], s["z"], s["weight"], EPS)}

    def fla(p: FlaPeer) -> Impl:
        fn = p.get("rms_norm_gated")

        def run(s: Tensors) -> Tensors:
            return {"y": fn(s["x"], s["z"], s["weight"], None, activation="swish", eps=EPS)}

        return Impl("fla", run)

    impl, why = _fla(ctx, ("rms_norm_gated",), fla)
    return Setup(
        case=f"T{B * T} × {d.HV} × {d.V}",
        floor=gated_rmsnorm_floor(d, B * T, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        fla_notes=["FLA rms_norm_gated (swish gate) also writes a float32 rstd per row"],
    )


def _gating(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {
            "a": r.normal((B, T, d.HV), dt),
            "b": r.normal((B, T, d.HV), dt),
            "A_log": torch.log(r.uniform((d.HV,), 1.0, 16.0)),
            "dt_bias": r.normal((d.HV,), torch.float32, scale=0.5),
        }

    def clef(s: Tensors) -> Tensors:
        g, beta = ctx.ops.gdn_gating(s["a"], s["b"], s["A_log"], s["dt_bias"])
        return {"g": g, "beta": beta}

    def fla(p: FlaPeer) -> Impl:
        gate, sig = p.get("gdn_gate"), p.get("beta_sigmoid")

        def run(s: Tensors) -> Tensors:
            g = gate(s["a"], s["A_log"], s["dt_bias"], output_dtype=torch.float32)
            return {"g": g, "beta": sig(s["b"])}

        return Impl("fla", run)

    impl, why = _fla(ctx, ("gdn_gate", "beta_sigmoid"), fla)
    return Setup(
        case=f"T{B * T} × {d.HV}",
        floor=gating_floor(d, B * T, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        fla_notes=["FLA gating: fused_gdn_gate (g) + fused_beta_sigmoid (beta), two launches"],
    )


def _l2norm(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        return {"x": Draw(ctx.device, seed).normal((B, T, d.H, d.K), dt)}

    def clef(s: Tensors) -> Tensors:
        return {"y": ctx.ops.l2norm(s["x"], EPS)}

    def fla(p: FlaPeer) -> Impl:
        fn = p.get("l2norm")

        def run(s: Tensors) -> Tensors:
            return {"y": fn(s["x"], eps=EPS)}

        return Impl("fla", run)

    impl, why = _fla(ctx, ("l2norm",), fla)
    return Setup(
        case=f"T{B * T} × {d.H} × {d.K}",
        floor=l2norm_floor(d, B * T, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        notes=["a q-shaped tensor [T, H, K]"],
        fla_notes=["FLA l2norm also writes a float32 rstd per row"],
    )


# ---- a GDN layer's decode step ---------------------------------------------------------------------


@dataclass(frozen=True)
class LayerWeights:
    """A GDN layer's parameters in the model's layouts and dtypes (A_log, dt_bias float32)."""

    in_proj_qkv: torch.Tensor  # [D, hidden]
    in_proj_z: torch.Tensor  # [HV*V, hidden]
    in_proj_b: torch.Tensor  # [HV, hidden]
    in_proj_a: torch.Tensor  # [HV, hidden]
    conv: torch.Tensor  # [D, W]
    A_log: torch.Tensor  # [HV] f32
    dt_bias: torch.Tensor  # [HV] f32
    norm: torch.Tensor  # [V]
    out_proj: torch.Tensor  # [hidden, HV*V]

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in vars(self).values())


def draw_layer_weights(d: Dims, device: torch.device, dtype: torch.dtype, seed: int) -> LayerWeights:
    r = Draw(device, seed)
    s_in = d.hidden**-0.5
    return LayerWeights(
        in_proj_qkv=r.normal((d.D, d.hidden), dtype, scale=s_in),
        in_proj_z=r.normal((d.HV * d.V, d.hidden), dtype, scale=s_in),
        in_proj_b=r.normal((d.HV, d.hidden), dtype, scale=s_in),
        in_proj_a=r.normal((d.HV, d.hidden), dtype, scale=s_in),
        conv=r.normal((d.D, d.W), dtype, scale=d.W**-0.5),
        A_log=torch.log(r.uniform((d.HV,), 1.0, 16.0)),
        dt_bias=r.normal((d.HV,), torch.float32, scale=0.5),
        norm=r.normal((d.V,), dtype, scale=0.1, mean=1.0),
        out_proj=r.normal((d.hidden, d.HV * d.V), dtype, scale=(d.HV * d.V) ** -0.5),
    )


def clef_core_step(
    ops: OpSet,
    d: Dims,
    w: LayerWeights,
    mixed: torch.Tensor,
    z: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """The GDN ops of a decode step through clef's op set, as `GatedDeltaNet.forward` calls them:
    ``mixed`` [B, T, D], ``z`` [B, T, HV, V], ``a``/``b`` [B, T, HV]; states updated in place."""
    B, T, _ = mixed.shape
    conv = ops.causal_conv1d_update(mixed, conv_state, w.conv, activation="silu")
    q, k, v = torch.split(conv, list(d.qkv_split), dim=-1)
    q = q.reshape(B, T, d.H, d.K).contiguous()
    k = k.reshape(B, T, d.H, d.K).contiguous()
    v = v.reshape(B, T, d.HV, d.V).contiguous()
    g, beta = ops.gdn_gating(a, b, w.A_log, w.dt_bias)
    o = ops.fused_recurrent_gated_delta_rule(q, k, v, g, beta, state=state, use_qk_l2norm=True)
    return ops.gated_rmsnorm(o, z, w.norm, EPS)


def fla_core_step(
    p: FlaPeer,
    d: Dims,
    w: LayerWeights,
    mixed: torch.Tensor,
    z: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    cache: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step on FLA, as FLA's own GatedDeltaNet layer decodes (gate and beta sigmoid fused
    into the recurrent kernel), with one conv over the whole ``[q | k | v]`` band.  ``cache`` is
    FLA's ``[B, D, W]`` conv cache (updated in place); returns (output, new recurrent state)."""
    B, T, _ = mixed.shape
    conv, _ = p.get("conv_update")(x=mixed, cache=cache, weight=w.conv, activation="silu")
    q, k, v = torch.split(conv, list(d.qkv_split), dim=-1)
    o, new_state = p.get("recurrent")(
        q.reshape(B, T, d.H, d.K),
        k.reshape(B, T, d.H, d.K),
        v.reshape(B, T, d.HV, d.V),
        g=a,
        beta=b,
        A_log=w.A_log,
        dt_bias=w.dt_bias,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
    )
    y = p.get("rms_norm_gated")(o, z, w.norm, None, activation="swish", eps=EPS)
    return y, new_state


def _clef_layer_from_model(ctx: Context, w: LayerWeights) -> Callable[[Tensors], torch.Tensor]:
    """clef's layer step through the model's own `GatedDeltaNet` module (raises if unusable)."""
    from clef_runtime.model.cache import GDNState
    from clef_runtime.model.config import preset
    from clef_runtime.model.layers import GatedDeltaNet

    d = ctx.dims
    cfg = preset("qwen3_5").replace(
        hidden_size=d.hidden,
        linear_num_key_heads=d.H,
        linear_num_value_heads=d.HV,
        linear_key_head_dim=d.K,
        linear_value_head_dim=d.V,
        linear_conv_kernel_dim=d.W,
        rms_norm_eps=EPS,
    )
    with torch.device("meta"):
        layer = GatedDeltaNet(cfg, 0)
    layer.load_state_dict(
        {
            "in_proj_qkv.weight": w.in_proj_qkv,
            "in_proj_z.weight": w.in_proj_z,
            "in_proj_b.weight": w.in_proj_b,
            "in_proj_a.weight": w.in_proj_a,
            "conv1d.weight": w.conv.unsqueeze(1),
            "dt_bias": w.dt_bias,
            "A_log": w.A_log,
            "norm.weight": w.norm,
            "out_proj.weight": w.out_proj,
        },
        strict=True,
        assign=True,
    )
    layer.requires_grad_(False)

    def step(s: Tensors) -> torch.Tensor:
        state = GDNState(conv=s["conv_state"], recurrent=s["state"])
        out: torch.Tensor = layer(s["x"], ctx.ops, state, decode=True)
        return out

    return step


def _clef_layer_from_ops(ctx: Context, w: LayerWeights) -> Callable[[Tensors], torch.Tensor]:
    """The same step built from the op set and torch matmuls (when the model is unusable)."""
    d = ctx.dims

    def step(s: Tensors) -> torch.Tensor:
        x = s["x"]
        B, T, _ = x.shape
        mixed = F.linear(x, w.in_proj_qkv)
        z = F.linear(x, w.in_proj_z).view(B, T, d.HV, d.V)
        b, a = F.linear(x, w.in_proj_b), F.linear(x, w.in_proj_a)
        y = clef_core_step(ctx.ops, d, w, mixed, z, a, b, s["conv_state"], s["state"])
        return F.linear(y.reshape(B, T, d.HV * d.V), w.out_proj)

    return step


def _decode_states(r: Draw, d: Dims, B: int, dt: torch.dtype) -> Tensors:
    return {
        "conv_state": r.normal((B, d.D, d.W - 1), dt),
        "state": r.normal((B, d.HV, d.K, d.V), torch.float32, scale=0.1),
    }


def _fla_layer_cache(s: Tensors) -> Tensors:
    return {**s, "cache": _fla_cache({"state": s["conv_state"]})["cache"]}


def _layer_decode(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype
    w = draw_layer_weights(d, ctx.device, dt, seed=7)
    notes = []
    try:
        clef_step = _clef_layer_from_model(ctx, w)
        notes.append(
            "clef: clef_runtime.model.layers.GatedDeltaNet.forward(decode=True) on the Triton op set"
        )
    except Exception as e:
        clef_step = _clef_layer_from_ops(ctx, w)
        notes.append(
            f"clef: built from the op set + torch matmuls (the model's GatedDeltaNet was unusable: "
            f"{type(e).__name__}: {e})"
        )
    notes.append("the projections dominate the byte floor: every weight is read once per step")
    fla_notes = [
        "FLA layer step: the same matmuls (F.linear), one conv update over [q|k|v], fused_recurrent "
        "with gate and beta sigmoid in the kernel (as FLA's own GatedDeltaNet decodes), rms_norm_gated"
    ]

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {"x": r.normal((B, T, d.hidden), dt), **_decode_states(r, d, B, dt)}

    def clef(s: Tensors) -> Tensors:
        return {"out": clef_step(s), "conv_state": s["conv_state"], "state": s["state"]}

    def fla(p: FlaPeer) -> Impl:
        def run(s: Tensors) -> Tensors:
            x = s["x"]
            mixed = F.linear(x, w.in_proj_qkv)
            z = F.linear(x, w.in_proj_z).view(B, T, d.HV, d.V)
            b, a = F.linear(x, w.in_proj_b), F.linear(x, w.in_proj_a)
            y, new_state = fla_core_step(p, d, w, mixed, z, a, b, s["cache"], s["state"])
            out = F.linear(y.reshape(B, T, d.HV * d.V), w.out_proj)
            return {"out": out, "conv_state": s["cache"][..., 1:], "state": new_state}

        return Impl("fla", run, prepare=_fla_layer_cache)

    impl, why = _fla(ctx, ("conv_update", "recurrent", "rms_norm_gated"), fla)
    return Setup(
        case=f"B{B} hidden {d.hidden}",
        floor=layer_decode_floor(d, B, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        notes=notes,
        fla_notes=fla_notes,
        shared_bytes=w.nbytes,
    )


def _layer_core(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype
    w = draw_layer_weights(d, ctx.device, dt, seed=7)

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {
            "mixed": r.normal((B, T, d.D), dt),
            "z": r.normal((B, T, d.HV, d.V), dt),
            "a": r.normal((B, T, d.HV), dt),
            "b": r.normal((B, T, d.HV), dt),
            **_decode_states(r, d, B, dt),
        }

    def clef(s: Tensors) -> Tensors:
        y = clef_core_step(ctx.ops, d, w, s["mixed"], s["z"], s["a"], s["b"], s["conv_state"], s["state"])
        return {"out": y, "conv_state": s["conv_state"], "state": s["state"]}

    def fla(p: FlaPeer) -> Impl:
        def run(s: Tensors) -> Tensors:
            y, new_state = fla_core_step(p, d, w, s["mixed"], s["z"], s["a"], s["b"], s["cache"], s["state"])
            return {"out": y, "conv_state": s["cache"][..., 1:], "state": new_state}

        return Impl("fla", run, prepare=_fla_layer_cache)

    impl, why = _fla(ctx, ("conv_update", "recurrent", "rms_norm_gated"), fla)
    return Setup(
        case=f"B{B}",
        floor=layer_core_floor(d, B, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        notes=[
            "the GDN ops of a decode step without the projections (conv update, gating, recurrent "
            "step, gated norm), clef's op set called as GatedDeltaNet.forward calls it"
        ],
        fla_notes=["FLA core step: as in the layer step, without the projections"],
        shared_bytes=w.conv.nbytes + w.A_log.nbytes + w.dt_bias.nbytes + w.norm.nbytes,
    )


CHUNK_OP = "chunk_gated_delta_rule"
RECURRENT_OP = "fused_recurrent_gated_delta_rule"

ROWS: tuple[Row, ...] = (
    Row("chunk_b1_t32768", CHUNK_OP, False, (1, 32768), (1, 128), _chunk),
    Row("chunk_b1_t8192", CHUNK_OP, False, (1, 8192), (1, 64), _chunk),
    Row("chunk_b4_t8192", CHUNK_OP, False, (4, 8192), (2, 64), _chunk),
    Row("chunk_b1_t2048_graph", CHUNK_OP, True, (1, 2048), (1, 64), _chunk),
    Row("chunk_b1_t131072", CHUNK_OP, False, (1, 131072), (1, 192), _chunk),
    Row("chunk_packed_8x4096", CHUNK_OP, False, (1, 32768), (1, 64), _chunk_packed),
    Row("chunk_b1_t512_graph", CHUNK_OP, True, (1, 512), (1, 32), _chunk),
    Row("recurrent_b1", RECURRENT_OP, True, (1, 1), (1, 1), _recurrent),
    Row("recurrent_b32", RECURRENT_OP, True, (32, 1), (2, 1), _recurrent),
    Row("recurrent_b128", RECURRENT_OP, True, (128, 1), (3, 1), _recurrent),
    Row("recurrent_b512", RECURRENT_OP, True, (512, 1), (4, 1), _recurrent),
    Row("conv_b1_t32768", "causal_conv1d", False, (1, 32768), (1, 64), _conv),
    Row("conv_update_b1", "causal_conv1d_update", True, (1, 1), (1, 1), _conv_update),
    Row("conv_update_b256", "causal_conv1d_update", True, (256, 1), (4, 1), _conv_update),
    Row("gated_rmsnorm_t8192", "gated_rmsnorm", False, (1, 8192), (1, 16), _gated_rmsnorm),
    Row("gdn_gating_t8192", "gdn_gating", False, (1, 8192), (1, 16), _gating),
    Row("l2norm_t8192", "l2norm", False, (1, 8192), (1, 16), _l2norm),
    Row("layer_decode_b1_graph", "gdn_layer_decode_step", True, (1, 1), (1, 1), _layer_decode),
    Row("layer_core_decode_b1_graph", "gdn_core_decode_step", True, (1, 1), (1, 1), _layer_core),
)


def select_rows(patterns: list[str] | None) -> tuple[list[Row], list[str]]:
    """Rows matching any pattern (a row name, a glob over names, a name prefix such as ``chunk`` or
    ``recurrent``, or an op name); returns (rows in table order, patterns that matched nothing)."""
    if not patterns:
        return list(ROWS), []

    def hit(row: Row, p: str) -> bool:
        return fnmatchcase(row.name, p) or row.name.startswith(p + "_") or row.op == p

    unmatched = [p for p in patterns if not any(hit(r, p) for r in ROWS)]
    return [r for r in ROWS if any(hit(r, p) for p in patterns)], unmatched


def rotation_sets(
    set_bytes: int, shared_bytes: int, target_bytes: int, min_sets: int, max_sets: int, memory_bytes: int
) -> int:
    """How many input sets to rotate through so that between two uses of one set at least
    ``target_bytes`` (a few times the L2) pass through memory: each call touches its own set and
    the shared tensors.  At least ``min_sets`` (so that a round amortises the event and graph-launch
    overhead over several calls), at most ``max_sets``, and all sets within ``memory_bytes``."""
    per_call = max(1, set_bytes + shared_bytes)
    n = max(min_sets, math.ceil(target_bytes / per_call))
    n = min(n, max_sets, memory_bytes // max(1, set_bytes))
    return max(1, n)
