"""Per-kernel GPU time of the chunked delta rule beside its peers, by torch.profiler.

Which launch of clef's `chunk_gated_delta_rule` dominates at the Qwen3.5-9B GDN shapes (B1, 16 key
/ 32 value heads of 128), and where FlashQLA (``flash_qla``) and FLA's Triton kernels spend theirs
on the same inputs, when importable: three warm-up calls, then twenty under the profiler; GPU time
a call per kernel, largest first.  ``--packed N`` splits the T tokens into N packed sequences;
``--no-qk-l2norm`` draws q and k normalised and turns the in-kernel norm off.  GPU only.

    PYTHONPATH=runtime:contract python3 bench/profile_chunk.py [T] [bf16|f16] [--packed N] [--no-qk-l2norm]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from clef_runtime.bench.fla_peer import DISPATCH_ENV, load_flashqla
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops import chunk_gated_delta_rule

H, HV, K, V = 16, 32, 128, 128
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
CALLS = 20


def parse(argv: list[str]) -> argparse.Namespace:
    """``[T] [dtype] [--packed N] [--no-qk-l2norm]``; an unknown dtype names the choices, and a
    packed count must divide T."""
    p = argparse.ArgumentParser(prog="profile_chunk.py")
    p.add_argument("T", nargs="?", type=int, default=32768)
    p.add_argument("dtype", nargs="?", default="bf16")
    p.add_argument("--packed", type=int, default=0, metavar="N")
    p.add_argument("--no-qk-l2norm", dest="norm", action="store_false")
    a = p.parse_args(argv)
    if a.dtype not in DTYPES:
        raise SystemExit(f"dtype {a.dtype!r}: use one of {sorted(DTYPES)}")
    if a.packed < 0 or (a.packed and a.T % a.packed):
        raise SystemExit(f"--packed {a.packed}: use a count ≥ 1 that divides T = {a.T}")
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


def main(argv: list[str]) -> None:
    a = parse(argv)
    T, norm = a.T, a.norm
    # FLA dispatches its chunked call to FlashQLA when flash_qla is importable, unless this is set
    # before FLA's import: "fla" below stays FLA's Triton kernels
    os.environ.setdefault(DISPATCH_ENV, "1")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g, beta = gdn_inputs(
        gen, torch.device("cuda"), a.dtype, B=1, T=T, H=H, HV=HV, K=K, V=V, normalise_qk=not norm
    )
    cu = torch.arange(0, T + 1, T // a.packed, dtype=torch.int32, device="cuda") if a.packed else None
    cu64 = None if cu is None else cu.long()

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

    case = f"{a.packed} packed × {T // a.packed}" if a.packed else f"B1 T{T}"
    print(f"{case}, {a.dtype}, in-kernel q/k norm {norm}: GPU µs a call, {CALLS} calls")
    for name, fn in impls.items():
        try:
            times = per_kernel(fn)
        except Exception as exc:  # a peer that cannot run these inputs (clef's own errors raise)
            if name == "clef":
                raise
            print(f"== {name}: did not run ({type(exc).__name__}: {exc})")
            continue
        print(f"== {name}: {sum(times.values()):.1f} µs")
        for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"  {us:9.1f}  {kernel[:90]}")


if __name__ == "__main__":
    main(sys.argv[1:])
