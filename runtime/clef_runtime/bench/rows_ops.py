"""The kernel rows: the chunked delta rule (prefill), the recurrent delta rule (decode), the causal
conv and its update, the norms and the gating; each with its shapes, fresh random inputs, clef's
call, FLA's (and FlashQLA's) call in clef's layouts and its byte/FLOP floor."""

from __future__ import annotations

from collections.abc import Callable

import torch

from clef_runtime.bench.fla_peer import FlaPeer
from clef_runtime.bench.floors import (
    chunk_floor,
    conv_floor,
    conv_update_floor,
    gated_rmsnorm_floor,
    gating_floor,
    l2norm_floor,
    recurrent_floor,
)
from clef_runtime.bench.row_types import EPS, Context, Draw, Impl, Setup, Tensors, fla_impl, gdn_set, require

# ---- chunked delta rule (prefill) ---------------------------------------------------------------


FLASHQLA = "flashqla"
SPLIT = "clef-split"


def chunk(ctx: Context, B: int, T: int, seqs: int = 0) -> Setup:
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
        return {**gdn_set(Draw(ctx.device, seed), d, B, T, dt, normalise_qk=not ctx.qk_l2norm), **offsets}

    def call(fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], what: str, **kw: object) -> Impl:
        cu_key = "cu_seqlens" if what.startswith("clef") else "cu_seqlens64"

        def run(s: Tensors) -> Tensors:
            o, final = fn(s["q"], s["k"], s["v"], s["g"], s["beta"], cu_seqlens=s.get(cu_key),
                          output_final_state=True, **kw)  # fmt: skip
            return {"o": o, "final_state": require(final, what)}

        return Impl(what, run)

    norm = ctx.qk_l2norm
    impl, why = fla_impl(ctx, ("chunk",), lambda p: call(p.get("chunk"), "fla", use_qk_l2norm_in_kernel=norm))
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


def chunk_packed(ctx: Context, B: int, T: int) -> Setup:
    return chunk(ctx, 1, T, seqs=8)


# ---- recurrent delta rule (decode) --------------------------------------------------------------


def recurrent(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {**gdn_set(r, d, B, T, dt), "state": r.normal((B, d.HV, d.K, d.V), torch.float32, scale=0.1)}

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

    impl, why = fla_impl(ctx, ("recurrent",), fla)
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


def conv(ctx: Context, B: int, T: int) -> Setup:
    d, dt = ctx.dims, ctx.dtype

    def make_set(seed: int) -> Tensors:
        r = Draw(ctx.device, seed)
        return {"x": r.normal((B, T, d.D), dt), "weight": r.normal((d.D, d.W), dt, scale=d.W**-0.5)}

    def clef(s: Tensors) -> Tensors:
        y, final = ctx.ops.causal_conv1d(s["x"], s["weight"], activation="silu", output_final_state=True)
        return {"y": y, "final_state": require(final, "causal_conv1d")}

    def fla(p: FlaPeer) -> Impl:
        fn = p.get("conv")

        def run(s: Tensors) -> Tensors:
            y, final = fn(
                x=s["x"], weight=s["weight"], activation="silu", output_final_state=True, backend="triton"
            )
            return {"y": y, "final_state": final[..., 1:]}  # FLA keeps W inputs, clef W - 1

        return Impl("fla", run)

    impl, why = fla_impl(ctx, ("conv",), fla)
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


def fla_conv_cache(s: Tensors) -> Tensors:
    """FLA's decode conv cache ``[B, D, W]`` from clef's ``[B, D, W - 1]`` state: FLA reads columns
    1..W-1 and shifts; column 0 is never read (a copy of the oldest input stands in)."""
    st = s["state"]
    return {**s, "cache": torch.cat([st[..., :1], st], dim=-1).contiguous()}


def conv_update(ctx: Context, B: int, T: int) -> Setup:
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

        return Impl("fla", run, prepare=fla_conv_cache)

    impl, why = fla_impl(ctx, ("conv_update",), fla)
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


def gated_rmsnorm(ctx: Context, B: int, T: int) -> Setup:
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

    impl, why = fla_impl(ctx, ("rms_norm_gated",), fla)
    return Setup(
        case=f"T{B * T} × {d.HV} × {d.V}",
        floor=gated_rmsnorm_floor(d, B * T, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        fla_notes=["FLA rms_norm_gated (swish gate) also writes a float32 rstd per row"],
    )


def gating(ctx: Context, B: int, T: int) -> Setup:
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

    impl, why = fla_impl(ctx, ("gdn_gate", "beta_sigmoid"), fla)
    return Setup(
        case=f"T{B * T} × {d.HV}",
        floor=gating_floor(d, B * T, ctx.elt),
        make_set=make_set,
        clef=Impl("clef", clef),
        fla=impl,
        fla_missing=why,
        fla_notes=["FLA gating: fused_gdn_gate (g) + fused_beta_sigmoid (beta), two launches"],
    )


def l2norm(ctx: Context, B: int, T: int) -> Setup:
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

    impl, why = fla_impl(ctx, ("l2norm",), fla)
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
