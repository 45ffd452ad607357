"""The fold (`delta_rule_chunk_split.FORM_WU`: launch 1 stores T, the walk takes
v_new = T (β v - β e^{G} k̂ S)) against w and u stored, on the rows the split design runs
unsplit (B4 T8192, 8 packed sequences of 4096 tokens; the fold at several walk shapes) and on
the B1 rows it splits into segments.  bf16, the Qwen3.5 shapes, the bench's gates
(g = logsigmoid(N(3, 1))), whole-call time by CUDA events over rotated input sets (GRAPH=1: by
graph replay), median of 7; each variant's relative L2 error (output and final state) against
the default path; per-kernel times (torch.profiler) of the default and the fastest variant.

    GRAPH=1 [ONLY="default,solve f16"] PYTHONPATH=runtime:contract python3 hack/device/probe_fold.py [rows]
    rows: b4_t8192, packed_8x4096, b1_t8192, b1_t32768, b1_t2048, b1_t131072 (comma-separated,
    or all)
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from probe_timing import (
    CHUNK_ROWS,
    kernel_times,
    print_ratios,
    rel,
    time_it,
)  # hack/device, the script's folder

from clef_runtime.ops import delta_rule_chunk as dc
from clef_runtime.ops import delta_rule_chunk_split as ds
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule

H, HV, K, V = 16, 32, 128, 128
ROWS = {
    **{
        name: CHUNK_ROWS[name]
        for name in ("b4_t8192", "packed_8x4096", "b1_t8192", "b1_t32768", "b1_t2048", "b1_t131072")
    },
    "b8_t8192": (8, 8192, 0),  # more chains than the bench's rows: where whole-V walks may pay
    "packed_16x2048": (1, 32768, 16),
}
want = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else list(ROWS)
dt = torch.bfloat16


def inputs(B: int, T: int, seed: int) -> dict[str, torch.Tensor]:
    g0 = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "q": torch.randn(B, T, H, K, device="cuda", generator=g0).to(dt),
        "k": torch.randn(B, T, H, K, device="cuda", generator=g0).to(dt),
        "v": torch.randn(B, T, HV, V, device="cuda", generator=g0).to(dt),
        "g": F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=g0) + 3),
        "beta": torch.rand(B, T, HV, device="cuda", generator=g0),
    }


def with_knobs(cu: torch.Tensor | None, **knobs: object) -> Callable[[dict], object]:  # type: ignore[type-arg]
    """The default path with module constants set for the call: of `delta_rule_chunk_split`, or
    of `delta_rule_chunk` where the name starts with ``dc_``."""

    def where(name: str) -> tuple[object, str]:
        return (dc, name[3:]) if name.startswith("dc_") else (ds, name)

    def run(s: dict) -> object:  # type: ignore[type-arg]
        keep = {name: getattr(*where(name)) for name in knobs}
        for name, val in knobs.items():
            setattr(*where(name), val)
        try:
            return chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta"], output_final_state=True,
                                          use_qk_l2norm=True, cu_seqlens=cu)  # fmt: skip
        finally:
            for name, val in keep.items():
                setattr(*where(name), val)

    return run


def launch1_at(warps: int, regs: int | None) -> Callable[..., dc.LaunchConfig]:
    """`delta_rule_chunk.launch_config` with launch 1 at these warps and register cap."""
    base = dc.launch_config

    def config(*args: object) -> dc.LaunchConfig:
        return dataclasses.replace(base(*args), warps1=warps, regs1=regs, regs1_t=regs)  # type: ignore[arg-type]

    return config


def variants(cu: torch.Tensor | None, unsplit: bool) -> dict[str, Callable[[dict], object]]:  # type: ignore[type-arg]
    """The default path (folded, the state held transposed, `walk_shape`'s blocks); the walk at
    other shapes; with MORE=1 also w and u stored (FORM_WU off: whole-V walks at 8 warps), three
    stages and twice the segments."""
    out = {
        "default": with_knobs(cu),
        "vk 64w4": with_knobs(cu, FOLD_BV=64, FOLD_WARPS=4, WIDE_PER_SM=None),
        "vk 128w8": with_knobs(cu, FOLD_BV=128, FOLD_WARPS=8, WIDE_PER_SM=None),
        "vk 128w8 2 stages": with_knobs(cu, FOLD_BV=128, FOLD_WARPS=8, WIDE_PER_SM=None, WIDE_STAGES=2),
        "factors masked": with_knobs(cu, TMA_FACTORS=False),  # k's factors by per-thread copies (pass 10)
        "beta in T": with_knobs(cu, BETA_IN_T=True),  # launch 1 stores T diag(β): the walk loads no β (pass 12)
        # pass 13: the factors by chunk slot, β too; before it the input's β, and packed calls'
        # factors by per-thread copies
        "beta strided": with_knobs(cu, BETA_ROWS=False),
        "twelfth pass": with_knobs(cu, BETA_ROWS=False, TMA_FACTORS=cu is None),
        "beta not by TMA": with_knobs(cu, TMA_WIDE_FACTORS=False),  # whole-V walks: β contiguous, masked
        # launch 1 at three programs per SM (4 warps capped at 168 registers: before pass 13) or
        # two of 8 warps (128 registers, no spill), against four of 4 warps at 128 (24 bytes of
        # spill on sm_90; pass 13: 1.01-1.03x)
        "l1 cap168": with_knobs(cu, dc_launch_config=launch1_at(4, 168)),
        # the walk by programmatic dependent launch (prepared in pass 13, off until timed)
        "pdl": with_knobs(cu, PDL=True),
        "l1 8w": with_knobs(cu, dc_launch_config=launch1_at(8, None)),
        # whole-V walks at twice the segments (two waves of one program per SM), and 64-wide ones
        "wide P8": with_knobs(cu, FOLD_BV=128, FOLD_WARPS=8, WIDE_PER_SM=None, TARGET_PROGRAMS=256),
        "64w4 P8": with_knobs(cu, TARGET_PROGRAMS=256),
        "vk 64w8": with_knobs(cu, FOLD_BV=64, FOLD_WARPS=8, WIDE_PER_SM=None),  # no spill on sm_90
        "masked loads": with_knobs(cu, TMA_TILES=False),  # the walk's tiles by per-thread copies
        "solve tf32": with_knobs(cu, dc_SOLVE_F16=False),  # launch 1's solve dots at TF32 (before pass 11)
        "masked loads 64w4": with_knobs(cu, TMA_TILES=False, FOLD_BV=64, FOLD_WARPS=4, WIDE_PER_SM=None),
    }
    if not unsplit:  # 64w8 at one program per SM: half the segments to stay in one wave
        out["vk 64w8 half segments"] = with_knobs(
            cu, FOLD_BV=64, FOLD_WARPS=8, WIDE_PER_SM=None, TARGET_PROGRAMS=ds.TARGET_PROGRAMS // 2
        )
    if os.environ.get("GLUON"):  # the walk in Gluon (gluon_walk.py): its wgmma asynchronous or not, ablations
        from gluon_walk import chunk_gated_delta_rule_gluon

        def gluon(**kw: object) -> Callable[[dict], object]:  # type: ignore[type-arg]
            return lambda s: chunk_gated_delta_rule_gluon(
                s["q"], s["k"], s["v"], s["g"], s["beta"], cu_seqlens=cu, **kw
            )

        out["gluon overlap"] = gluon(overlap=True)
        out["gluon serial"] = gluon(overlap=False)
        for abl, what in ((1, "no loads"), (2, "no store"), (3, "no loads no store")):
            out[f"gluon serial {what}"] = gluon(overlap=False, ablate=abl)
        if os.environ.get("GLUON") == "only":
            return {k: v for k, v in out.items() if k == "default" or k.startswith("gluon")}
    if os.environ.get("MORE"):
        out["stored"] = with_knobs(cu, FORM_WU=False)
        out["vk 3 stages"] = with_knobs(cu, SPLIT_STAGES=3)
        if not unsplit:
            out["vk 2x segments"] = with_knobs(cu, TARGET_PROGRAMS=2 * ds.TARGET_PROGRAMS)
    if os.environ.get("ONLY"):  # ONLY="default,solve f16": these variants alone (default always)
        keep = {"default", *os.environ["ONLY"].split(",")}
        out = {k: v for k, v in out.items() if k in keep}
    return out


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    table = []
    for name in want:
        B, T, seqs = ROWS[name]
        cu = torch.arange(0, T + 1, T // seqs, dtype=torch.int32, device="cuda") if seqs else None
        set_bytes = B * T * (2 * H * K + 2 * HV * V) * 2
        sets = [inputs(B, T, i) for i in range(max(2, min(8, -(-200_000_000 // set_bytes))))]
        vs = variants(cu, unsplit=B * max(1, seqs) * HV >= ds.DEFAULT_MIN_CHAINS)
        ref_o, ref_h = vs["default"](sets[0])  # type: ignore[misc]
        times = {}
        for vname, fn in vs.items():
            o, h = fn(sets[0])  # type: ignore[misc]
            err = max(rel(o, ref_o), rel(h, ref_h))
            ok = bool(torch.isfinite(o).all() and torch.isfinite(h).all())
            time_it(fn, sets, 1)
            times[vname] = time_it(fn, sets)
            print(
                f"{name} {vname}: {times[vname] * 1e6:.1f} us, err vs default {err:.2e}, finite {ok}",
                flush=True,
            )
            table.append((name, vname, times[vname], err))
        best = min(times, key=times.__getitem__)
        for vname in dict.fromkeys(("default", best)):
            kernel_times(vs[vname], sets, f"{name} {vname}")
        del sets
        torch.cuda.empty_cache()
    print_ratios(table, "default")


if __name__ == "__main__":
    main()
