"""Per-kernel GPU time of the chunked delta rule beside its peers, by torch.profiler.

Which launch of clef's `chunk_gated_delta_rule` dominates at the Qwen3.5-9B GDN shapes (B1, 16 key
/ 32 value heads of 128), and where FlashQLA (``flash_qla``) and FLA's Triton kernels spend theirs
on the same inputs, when importable: three warm-up calls, then twenty under the profiler; GPU time
a call per kernel, largest first.  ``--batch B`` takes B sequences of T tokens; ``--packed N``
splits the T tokens into N packed sequences, ``--lens L1,L2,...`` packs sequences of those lengths
(T their sum: uneven batches as engines pack them); ``--no-qk-l2norm`` draws q and k normalised and turns
the in-kernel norm off.  ``--walk SEGMENTS,BLOCK_V,WARPS,STAGES`` runs clef's split design with
that walk forced (0: the default for that part; `chunk_gated_delta_rule_split`) and no peers, to
time walk shapes against each other.  GPU only.

    PYTHONPATH=runtime:contract python3 bench/profile_chunk.py [T] [bf16|f16] [--batch B] [--packed N]
        [--lens L1,L2,...] [--no-qk-l2norm] [--walk S,BV,W,ST]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from clef_runtime.bench.fla_peer import DISPATCH_ENV, load_flashqla
from clef_runtime.bench.timing import capture_graph
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops import chunk_gated_delta_rule
from clef_runtime.ops.delta_rule_chunk_split import chunk_gated_delta_rule_split

H, HV, K, V = 16, 32, 128, 128
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
CALLS = 20


def parse(argv: list[str]) -> argparse.Namespace:
    """``[T] [dtype] [--batch B] [--packed N] [--lens L1,...] [--no-qk-l2norm] [--walk S,BV,W,ST]``;
    an unknown dtype names the choices, a packed count must divide T, lengths are counts ≥ 0 (T
    becomes their sum), and a forced walk takes four counts."""
    p = argparse.ArgumentParser(prog="profile_chunk.py")
    p.add_argument("T", nargs="?", type=int, default=32768)
    p.add_argument("dtype", nargs="?", default="bf16")
    p.add_argument("--batch", type=int, default=1, metavar="B")
    p.add_argument("--packed", type=int, default=0, metavar="N")
    p.add_argument("--lens", default=None, metavar="L1,L2,...")
    p.add_argument("--no-qk-l2norm", dest="norm", action="store_false")
    p.add_argument("--walk", default=None, metavar="S,BV,W,ST")
    a = p.parse_args(argv)
    if a.dtype not in DTYPES:
        raise SystemExit(f"dtype {a.dtype!r}: use one of {sorted(DTYPES)}")
    if a.packed < 0 or (a.packed and a.T % a.packed):
        raise SystemExit(f"--packed {a.packed}: use a count ≥ 1 that divides T = {a.T}")
    if a.lens is not None:
        parts = a.lens.split(",")
        if a.packed or a.batch != 1 or not all(x.isdigit() for x in parts) or not sum(map(int, parts)):
            raise SystemExit(f"--lens {a.lens!r}: use counts ≥ 0 (not all 0), without --packed or --batch")
        a.lens = [int(x) for x in parts]
        a.T = sum(a.lens)
    elif a.packed:
        a.lens = [a.T // a.packed] * a.packed  # the packed sequences, for one cu_seqlens below
    if a.batch < 1 or (a.batch > 1 and a.packed):
        raise SystemExit(f"--batch {a.batch}: use a count ≥ 1, and 1 with --packed")
    if a.walk is not None:
        parts = a.walk.split(",")
        if len(parts) != 4 or not all(x.isdigit() for x in parts):
            raise SystemExit(f"--walk {a.walk!r}: use four counts ≥ 0, SEGMENTS,BLOCK_V,WARPS,STAGES")
        a.walk = dict(
            zip(("segments", "block_v", "warps", "stages"), (int(x) or None for x in parts), strict=True)
        )
    a.dtype = DTYPES[a.dtype]
    return a


def per_kernel(fn: Callable[[], object]) -> dict[str, float]:
    """GPU µs a call of each kernel `fn` launches (self time, so no kernel counts twice)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if ev.self_device_time_total > 0:
            out[ev.key] += ev.self_device_time_total / CALLS
    return dict(out)


def graph_call_us(fn: Callable[[], object], rounds: int = 5) -> float:
    """GPU µs of one call as a CUDA graph replays it: the median over ``rounds`` of CALLS replays
    back to back between two events.  Unlike `per_kernel`'s sum, kernels that overlap (a launch
    that starts before the one ahead of it ends, as a programmatic dependent launch does) count
    once, and no host time falls between them."""

    def call() -> None:
        fn()

    replay = capture_graph(call, torch.device("cuda"), warmup=3)
    replay()
    torch.cuda.synchronize()
    spans = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            replay()
        end.record()
        end.synchronize()
        spans.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(spans)


def report(name: str, times: dict[str, float]) -> None:
    """One implementation's total and its kernels, largest first (GPU µs a call)."""
    print(f"== {name}: {sum(times.values()):.1f} µs")
    for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"  {us:9.1f}  {kernel[:90]}")


def inputs(a: argparse.Namespace) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None, str]:
    """The case's (q, k, v, g, beta) on the GPU (seeded), its int32 cu_seqlens (None for B
    sequences) and its name."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkvgb = gdn_inputs(
        gen, torch.device("cuda"), a.dtype, B=a.batch, T=a.T, H=H, HV=HV, K=K, V=V, normalise_qk=not a.norm
    )
    cu = None
    if a.lens is not None:
        cu = torch.tensor([0, *itertools.accumulate(a.lens)], dtype=torch.int32, device="cuda")
    case = f"B{a.batch} T{a.T}"
    if a.packed:
        case = f"{a.packed} packed × {a.T // a.packed}"
    elif a.lens is not None:
        case = f"{len(a.lens)} packed of {a.lens}"
    return qkvgb, cu, case


def main(argv: list[str]) -> None:
    a = parse(argv)
    norm = a.norm
    # FLA dispatches its chunked call to FlashQLA when flash_qla is importable, unless this is set
    # before FLA's import: "fla" below stays FLA's Triton kernels
    os.environ.setdefault(DISPATCH_ENV, "1")
    (q, k, v, g, beta), cu, case = inputs(a)
    cu64 = None if cu is None else cu.long()
    if a.walk is not None:
        walk = a.walk
        print(f"{case}, {a.dtype}, in-kernel q/k norm {norm}, clef's split design with {walk}")
        report("clef", per_kernel(lambda: chunk_gated_delta_rule_split(
            q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=norm, **walk
        )))  # fmt: skip
        return
    impls: dict[str, Callable[[], object]] = {
        "clef": lambda: chunk_gated_delta_rule(
            q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=norm
        )
    }
    fq, fq_version = load_flashqla()
    if fq is not None:
        impls[f"flashqla {fq_version}"] = lambda: fq(
            q, k, v, g, beta, cu_seqlens=cu64, output_final_state=True, use_qk_l2norm_in_kernel=norm
        )
    else:
        print(f"flashqla: {fq_version}")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

        impls["fla"] = lambda: fla_chunk(
            q, k, v, g=g, beta=beta, cu_seqlens=cu64, output_final_state=True, use_qk_l2norm_in_kernel=norm
        )
    except Exception as exc:  # the peer is optional
        print(f"fla: not importable ({exc})")

    print(f"{case}, {a.dtype}, in-kernel q/k norm {norm}: GPU µs a call, {CALLS} calls")
    for name, fn in impls.items():
        try:
            times = per_kernel(fn)
        except Exception as exc:  # a peer that cannot run these inputs (clef's own errors raise)
            if name == "clef":
                raise
            print(f"== {name}: did not run ({type(exc).__name__}: {exc})")
            continue
        report(name, times)


if __name__ == "__main__":
    main(sys.argv[1:])
