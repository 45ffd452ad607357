"""Launch 1 (`_chunk_prepare_kernel`) alone: time text-edit variants of a module, with their
compile metadata (registers, spills, shared memory) and each output's relative error against
the first variant.  Variants are read from a table like probe_variants_table.py (the same edit
markers, applied by probe_variants.load_variant).

    PYTHONPATH=runtime python3 hack/device/probe_prepare.py [table] [T] [B] [module]

Inputs are B × T tokens at the Qwen3.5 shapes, bf16; at B1 T32768 they are ~0.55 GB, far past
the L2, so every call reads DRAM.  With FULL=1 the whole call (every launch) is timed as well.
With REF=1 each variant's whole call is also checked against the float64 token-by-token
reference on the GPU (relative L2 error of o and the final state), at B1 T1024 with random
inputs and with the solve's worst case (runs of equal keys, β = 1, g = 0): the accuracy of a
variant on the GPU's own arithmetic (TF32, 3xTF32), which the CPU interpreter cannot show.
ONLY=base,a,b runs those variants alone (errors compare to the first one named).  T_OUT=1 times the
fold's launch 1 (`prepare(..., t_out=True)`: T and the factors stored in place of w and u).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, "runtime")
sys.path.insert(0, str(pathlib.Path(__file__).parent))

TABLE = pathlib.Path(
    sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).with_name("probe_prepare_table.py")
)
T = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
B = int(sys.argv[3]) if len(sys.argv) > 3 else 1
MODULE = sys.argv[4] if len(sys.argv) > 4 else "clef_runtime.ops.delta_rule_chunk"
sys.argv[1:] = [str(T), "bf16", MODULE, str(B)]  # what probe_variants reads at import
import probe_variants as pv  # noqa: E402

OUTS = ("w", "u", "aqk", "gc", "kf", "qf")
T_OUT = os.environ.get("T_OUT") == "1"  # the fold's launch 1: T and the factors in w's and u's place


def events_median(fn, n: int) -> float:
    """Median µs per call over n calls, each between two CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3


def reference_cases() -> list[tuple[str, tuple]]:
    """(name, (q, k, v, g, beta)) at B1 T1024, Qwen shapes: random, and runs of equal keys."""
    from probe_variants import HV, H, K, V

    gen = torch.Generator(device="cuda").manual_seed(7)
    n = 1024
    q = torch.randn(1, n, H, K, device="cuda", generator=gen).to(torch.bfloat16)
    k = torch.randn(1, n, H, K, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(1, n, HV, V, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, n, HV, device="cuda", generator=gen) + 3)
    beta = torch.rand(1, n, HV, device="cuda", generator=gen)
    base = torch.randn(2, H, K, device="cuda", generator=gen)
    which = (torch.arange(n, device="cuda") // 40) % 2
    kr = (base[which] + 1e-3 * torch.randn(n, H, K, device="cuda", generator=gen))[None].to(torch.bfloat16)
    ones, zeros = torch.ones_like(beta), torch.zeros_like(g)
    return [("rand", (q, k, v, g, beta)), ("repeat", (q, kr, v, zeros, ones))]


def reference_errors(mod, cases, refs) -> str:
    out = []
    for (name, args), (ro, rh) in zip(cases, refs, strict=True):
        o, h = mod.chunk_gated_delta_rule(*args, output_final_state=True, use_qk_l2norm=True)
        eo = ((o.double() - ro).norm() / ro.norm()).item()
        eh = ((h.double() - rh).norm() / rh.norm()).item()
        out.append(f"{name}: o {eo:.2e} h {eh:.2e}")
    return "ref[" + ", ".join(out) + "]"


def compiled_meta(kernel) -> str:
    try:
        for cache in kernel.device_caches.values():
            for ck in cache[0].values():
                return f"regs={ck.n_regs} spills={ck.n_spills} smem={ck.metadata.shared}"
    except Exception as exc:  # metadata is a bonus
        return f"meta? {type(exc).__name__}"
    return "meta?"


def main() -> None:
    ns: dict = {}
    exec(TABLE.read_text(), ns)
    variants = ns["VARIANTS"]
    if os.environ.get("ONLY"):  # ONLY=base,name,...: these variants, in this order
        variants = {n: variants[n] for n in os.environ["ONLY"].split(",")}
    q, k, v, g, beta = pv.inputs()
    scale = q.shape[-1] ** -0.5
    print(f"B={B} T={T} bf16 module={MODULE} {torch.cuda.get_device_name()}", flush=True)
    ref = None
    rows = []
    cases = refs = None
    if os.environ.get("REF"):
        from clef_runtime.reference import delta_rule as reference

        cases = reference_cases()
        kw = dict(output_final_state=True, use_qk_l2norm=True)
        refs = [reference.chunk_gated_delta_rule(*(t.double() for t in a), **kw) for _, a in cases]
        refs = [(o.double(), h.double()) for o, h in refs]
    for name, edits in variants.items():
        mod = pv.load_variant(name, edits) if edits else __import__(MODULE, fromlist=["x"])
        if mod is None:
            continue

        def prep(mod=mod):
            return mod.prepare(q, k, v, g, beta, B, scale, None, True, False, True, t_out=T_OUT)

        try:
            p = prep()
            outs = {n: getattr(p, n).float() for n in OUTS}
            if ref is None:
                ref = outs
            errs = {
                n: ((outs[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)).item()
                if outs[n].shape == ref[n].shape
                else float("nan")  # a variant that stores something else there
                for n in OUTS
            }
            finite = all(torch.isfinite(o).all().item() for o in outs.values())
            us = events_median(prep, 30)
            full = ""
            if os.environ.get("FULL"):

                def call(mod=mod):
                    return mod.chunk_gated_delta_rule(
                        q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True
                    )

                fus = events_median(call, 10)
                full = f" full={fus:8.1f}"
            if cases is not None:
                full += " " + reference_errors(mod, cases, refs)
        except Exception as exc:  # a variant may not compile; say so and go on
            print(f"{name:24s} ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        err = " ".join(f"{n}={e:.1e}" for n, e in errs.items())
        line = f"{name:24s} prepare={us:8.1f} µs{full}  {compiled_meta(mod._chunk_prepare_kernel)}  finite={finite}  {err}"
        rows.append(line)
        print(line, flush=True)
    print("\n== summary")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
