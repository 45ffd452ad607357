"""The split design with warm-up walks (`delta_rule_chunk_split`, P segments per sequence)
against the three-launch design (`chunk_gated_delta_rule` with the B1 split off) and the default path at B1, bf16, the
Qwen3.5 shapes, for two gate distributions:

* ``bench``: g = logsigmoid(N(3, 1)) per token and head (the bench's inputs: ≈ -0.07 per token,
  a warm-up of ~4 chunks);
* ``model``: the Qwen3.5 gating at its initialisation, as `clef_runtime.inputs.gdn_inputs` draws
  it: per value head A ∈ U[1, 16], dt ∈ U[1e-3, 0.1], g = -A softplus(N(0, 1) + dt_bias) (heads
  from ≈ -0.002 to ≈ -1.6 per token: the slow heads warm up over thousands of tokens).

Whole-call time by CUDA events over rotated input sets (≥ 200 MB apart), median of 7 rounds;
each variant's relative L2 error against the default path; the warm-up lengths (chunks, mean
and max over heads and segments) from the same bounds launch 1 computes, in float64 here; and
per-kernel times (torch.profiler) at B1 T32768 for the best variant.

    PYTHONPATH=runtime python3 hack/device/probe_warmup.py [rows] [gates] [P list]
    WALK=4:64:4:2,8:64:4:3 ... adds split variants P:block_v:warps:stages
"""

from __future__ import annotations

import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "runtime")
from probe_timing import kernel_times, rel, time_it  # hack/device, the script's folder

from clef_runtime.ops import delta_rule_chunk_split as ds
from clef_runtime.ops.delta_rule_chunk import BT, chunk_gated_delta_rule
from clef_runtime.ops.delta_rule_chunk_split import (
    WARMUP_LOG_BOUND,
    chunk_gated_delta_rule_split,
    default_segments,
)

H, HV, K, V = 16, 32, 128, 128
ROWS = {"t2048": 2048, "t4096": 4096, "t8192": 8192, "t16384": 16384, "t32768": 32768, "t131072": 131072}
want = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else list(ROWS)
gates = sys.argv[2].split(",") if len(sys.argv) > 2 else ["bench", "model"]
plist = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [2, 4, 8]
dt = torch.bfloat16


def gate(kind: str, T: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "bench":
        return F.logsigmoid(torch.randn(1, T, HV, device="cuda", generator=gen) + 3)
    A = 1 + 15 * torch.rand(HV, device="cuda", generator=gen)
    dtv = 1e-3 + (0.1 - 1e-3) * torch.rand(HV, device="cuda", generator=gen)
    dt_bias = torch.log(torch.expm1(dtv))
    return -A * F.softplus(torch.randn(1, T, HV, device="cuda", generator=gen) + dt_bias)


def inputs(T: int, kind: str, seed: int) -> dict[str, torch.Tensor]:
    g0 = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "q": torch.randn(1, T, H, K, device="cuda", generator=g0).to(dt),
        "k": torch.randn(1, T, H, K, device="cuda", generator=g0).to(dt),
        "v": torch.randn(1, T, HV, V, device="cuda", generator=g0).to(dt),
        "g": gate(kind, T, g0),
        "beta": torch.rand(1, T, HV, device="cuda", generator=g0),
    }


def default(s):  # type: ignore[no-untyped-def]
    return chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta"], output_final_state=True,
                                  use_qk_l2norm=True)  # fmt: skip


def base(s):  # type: ignore[no-untyped-def]
    """The three launches: the default path with the B1 split turned off."""
    keep = ds.DEFAULT_MIN_SPLIT_TOKENS
    ds.DEFAULT_MIN_SPLIT_TOKENS = 1 << 62
    try:
        return default(s)
    finally:
        ds.DEFAULT_MIN_SPLIT_TOKENS = keep


def split(P: int, bv: int | None = None, warps: int | None = None, stages: int = ds.SPLIT_STAGES):  # type: ignore[no-untyped-def]
    return lambda s: chunk_gated_delta_rule_split(
        s["q"], s["k"], s["v"], s["g"], s["beta"], output_final_state=True, use_qk_l2norm=True, segments=P,
        block_v=bv, warps=warps, stages=stages,
    )  # fmt: skip


def stored_wu(fn):  # type: ignore[no-untyped-def]
    """``fn`` with launch 1 storing w and u (the split's FORM_WU off)."""

    def run(s):  # type: ignore[no-untyped-def]
        keep = ds.FORM_WU
        ds.FORM_WU = False
        try:
            return fn(s)
        finally:
            ds.FORM_WU = keep

    return run


def warmups(s: dict[str, torch.Tensor], P: int) -> tuple[float, int]:
    """(mean, max) warm-up chunks over heads and segments 1..P-1 (launch 1's bound, float64)."""
    T = s["g"].shape[1]
    k = s["k"].double()
    nk2 = k.pow(2).sum(-1).repeat_interleave(HV // H, dim=2)
    nk2 = nk2 / (nk2 + 1e-6)
    tok = s["g"].double() + torch.log(torch.clamp((1 - s["beta"].double() * nk2).abs(), min=1.0))
    b = F.pad(tok, (0, 0, 0, -T % BT)).view(-1, BT, HV).sum(1)  # [chunks, HV]
    nc = b.shape[0]
    seg = -(-nc // P)
    lens = []
    for sidx in range(1, P):
        c_lo = min(sidx * seg, nc)
        rc = torch.flip(torch.cumsum(torch.flip(b[:c_lo], [0]), 0), [0])  # rc[c] = Σ b[c..c_lo-1]
        for hv in range(HV):
            hit = torch.nonzero(rc[:, hv] < WARMUP_LOG_BOUND)
            c_w = int(hit.max()) if hit.numel() else -1
            lens.append(c_lo - c_w if c_w >= 0 else c_lo)
    return (statistics.mean(lens), max(lens)) if lens else (0.0, 0)


table = []
for kind in gates:
    for name in want:
        T = ROWS[name]
        set_bytes = T * (2 * H * K + 2 * HV * V) * 2
        n_sets = max(2, min(16, -(-200_000_000 // set_bytes)))
        sets = [inputs(T, kind, i) for i in range(n_sets)]
        p_def = default_segments(1, HV, V, T)
        variants = {"three": base, "default": default}
        for P in sorted({*plist, p_def}):
            variants[f"split P{P}" + ("*" if p_def == P else "")] = split(P)
        if os.environ.get("FORMWU_AB") == "1":  # the split with w and u stored by launch 1
            variants["split P4 stored w/u"] = stored_wu(split(4))
        # WALK=P:block_v:warps:stages,... adds walk launch shapes (the tree's defaults otherwise)
        for spec in filter(None, os.environ.get("WALK", "").split(",")):
            P, bv, nw, ns = (int(x) for x in spec.split(":"))
            variants[f"split P{P} bv{bv} w{nw} s{ns}"] = split(P, bv, nw, ns)
        ref_o, ref_h = base(sets[0])
        best, times = None, {}
        for vname, fn in variants.items():
            o, h = fn(sets[0])  # compile
            err = max(rel(o, ref_o), rel(h, ref_h))
            ok = bool(torch.isfinite(o).all() and torch.isfinite(h).all())
            time_it(fn, sets, 1)
            t = time_it(fn, sets)
            times[vname] = t
            wu = (
                warmups(sets[0], int(vname.split("P")[1].split()[0].rstrip("*")))
                if "P" in vname
                else (0.0, 0)
            )
            if "P" in vname and (best is None or t < times[best]):
                best = vname
            print(f"{kind} {name} {vname}: {t * 1e6:.1f} us, err vs three {err:.2e}, finite {ok}, "
                  f"warm-up chunks mean {wu[0]:.1f} max {wu[1]}", flush=True)  # fmt: skip
            table.append((kind, name, vname, t, err, wu))
        if name == "t32768":
            for vname in ("three", best, *(v for v in variants if "stored" in v or " bv" in v)):
                kernel_times(variants[vname], sets, f"{kind} {name} {vname}")
        del sets
        torch.cuda.empty_cache()

print(
    f"\ngates  row      variant        us/call  default/it  err      warm-up mean/max  (bound {WARMUP_LOG_BOUND:.2f})"
)
base_t = {(r[0], r[1]): r[3] for r in table if r[2] == "three"}
for kind, name, vname, t, err, wu in table:
    print(f"{kind:6s} {name:8s} {vname:26s} {t * 1e6:9.1f}  {base_t[(kind, name)] / t:6.2f}x  {err:.1e}  "
          f"{wu[0]:6.1f}/{wu[1]}")  # fmt: skip
assert math.isfinite(WARMUP_LOG_BOUND)
