"""The split chunk design against the three-launch one, per row and segment count, in one process:
whole-call time by CUDA events over rotated inputs (sets ≥ 200 MB apart), each variant's error
against the three-launch design, and per-kernel times (torch.profiler) at the default segments.

    PYTHONPATH=runtime python3 hack/device/probe_split.py [rows] [dtype] [variants]

rows: comma-separated of b1_t32768, b1_t8192, b4_t8192, b1_t2048, b1_t131072, packed_8x4096,
b1_t512 (default: all).  variants: comma-separated P:BV:warps (P 0: the default segments for that
BV; default: 1,2,4,8 and the default at the kept BV, warps).  Prints a line per (row, variant), a
table last.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "runtime")
from probe_timing import CHUNK_ROWS, print_ratios, rel, time_it  # hack/device, the script's folder

from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule
from clef_runtime.ops.delta_rule_chunk_split import chunk_gated_delta_rule_split, default_segments

H, HV, K, V = 16, 32, 128, 128
ROWS = CHUNK_ROWS
want = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else list(ROWS)
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[sys.argv[2] if len(sys.argv) > 2 else "bf16"]
SPEC = sys.argv[3] if len(sys.argv) > 3 else "1:32:4,2:32:4,4:32:4,8:32:4,0:32:4"


def inputs(B: int, T: int, seqs: int, seed: int) -> dict[str, torch.Tensor | None]:
    g0 = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "q": torch.randn(B, T, H, K, device="cuda", generator=g0).to(dtype),
        "k": torch.randn(B, T, H, K, device="cuda", generator=g0).to(dtype),
        "v": torch.randn(B, T, HV, V, device="cuda", generator=g0).to(dtype),
        "g": torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=g0) + 3),
        "beta": torch.rand(B, T, HV, device="cuda", generator=g0),
        "cu": torch.arange(0, T + 1, T // seqs, dtype=torch.int32, device="cuda") if seqs else None,
    }


def old(s):  # type: ignore[no-untyped-def]
    return chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta"], output_final_state=True,
                                  use_qk_l2norm=True, cu_seqlens=s["cu"])  # fmt: skip


def split(P, BV, W, S=3):  # type: ignore[no-untyped-def]
    return lambda s: chunk_gated_delta_rule_split(
        s["q"], s["k"], s["v"], s["g"], s["beta"], output_final_state=True, use_qk_l2norm=True,
        cu_seqlens=s["cu"], segments=P, block_v=BV, warps=W, stages=S,
    )  # fmt: skip


table = []
for name in want:
    B, T, seqs = ROWS[name]
    N = seqs or B
    set_bytes = B * T * (2 * H * K + 2 * HV * V) * 2
    n_sets = max(2, min(16, -(-200_000_000 // set_bytes)))
    sets = [inputs(B, T, seqs, i) for i in range(n_sets)]
    variants = {"old": old}
    best = None
    for spec in SPEC.split(","):
        P, BV, W, S = ([int(x) for x in spec.split(":")] + [3])[:4]
        P = P or default_segments(N, HV, V, T, BV)
        variants.setdefault(f"P{P} BV{BV} w{W} s{S}", split(P, BV, W, S))
    ref_o, ref_h = old(sets[0])
    times = {}
    for vname, fn in variants.items():
        o, h = fn(sets[0])  # compile
        err = max(rel(o, ref_o), rel(h, ref_h))
        time_it(fn, sets, 1)
        t = time_it(fn, sets)
        times[vname] = t
        if vname != "old" and (best is None or t < times[best]):
            best = vname
        print(f"{name} {vname}: {t * 1e6:.1f} us, rel err vs old {err:.2e}", flush=True)
        table.append((name, vname, t, err))
    # per kernel at the default segments (and the old design), 5 calls
    for vname in ("old", best):
        fn = variants[vname]
        run = (sets * 5)[:5]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for s in run:
                fn(s)
            torch.cuda.synchronize()
        calls = len(run)
        for ev in prof.key_averages():
            if ev.device_type.name == "CUDA" and "kernel" in ev.key:
                print(
                    f"  {name} {vname} {ev.key[:40]}: {ev.device_time_total / calls:.1f} us/call", flush=True
                )
    del sets
    torch.cuda.empty_cache()

print_ratios(table, "old")
