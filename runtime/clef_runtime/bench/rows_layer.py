"""The layer rows: one GDN layer's decode step, with and without its projections, clef's model
beside FLA's `GatedDeltaNet`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clef_runtime.bench.fla_peer import FlaPeer
from clef_runtime.bench.floors import (
    Dims,
    layer_core_floor,
    layer_decode_floor,
)
from clef_runtime.bench.row_types import EPS, Context, Draw, Impl, Setup, Tensors, fla_impl
from clef_runtime.bench.rows_ops import fla_conv_cache
from clef_runtime.opset import OpSet

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
    return {**s, "cache": fla_conv_cache({"state": s["conv_state"]})["cache"]}


def layer_decode(ctx: Context, B: int, T: int) -> Setup:
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

    impl, why = fla_impl(ctx, ("conv_update", "recurrent", "rms_norm_gated"), fla)
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


def layer_core(ctx: Context, B: int, T: int) -> Setup:
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

    impl, why = fla_impl(ctx, ("conv_update", "recurrent", "rms_norm_gated"), fla)
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
