"""Where the time goes inside the chunked delta rule's launches, without hardware counters: time
variants of a kernel that leave one stage out and take differences (the device notes' advice, docs/performance.md "Method").

Each variant is the module's source with a few text edits, written to a temporary file and
imported (Triton's jit needs real source), so the production module carries no probe flags.
A variant's numbers are wrong by design; only its time is read.

    PYTHONPATH=runtime python3 hack/device/probe_variants.py [T] [dtype] [module] [B]

`module` defaults to clef_runtime.ops.delta_rule_chunk; VARIANTS maps a name to
[(old, new), ...] text edits (or the markers documented in probe_variants_table.py).  An edit
whose `old` text is missing is reported and that variant skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, "runtime")

T = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[sys.argv[2] if len(sys.argv) > 2 else "bf16"]
MODULE = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else "clef_runtime.ops.delta_rule_chunk"
B = int(sys.argv[4]) if len(sys.argv) > 4 else 1
VARIANTS_FILE = pathlib.Path(__file__).with_name("probe_variants_table.py")

H, HV, K, V = 16, 32, 128, 128


def load_variant(name: str, edits: list[tuple[str, str]]):
    base = importlib.import_module(MODULE)
    src = pathlib.Path(base.__file__).read_text()
    for edit in edits:
        if edit[0] == "__SOURCE__":  # (marker, path): start from another file, e.g. a commit's version
            if not pathlib.Path(edit[1]).exists():
                print(f"{name}: source {edit[1]} missing")
                return None
            src = pathlib.Path(edit[1]).read_text()
            continue
        if edit[0] == "__REGION__":  # (marker, start text, end text, replacement of [start, end))
            _, start, end, new = edit
            if start not in src or end not in src:
                print(f"{name}: region missing")
                return None
            a = src.index(start)
            src = src[:a] + new + src[src.index(end, a):]
            continue
        old, new = edit
        if old not in src:
            print(f"{name}: edit target missing: {old[:60]!r}")
            return None
        src = src.replace(old, new)
    d = tempfile.mkdtemp()
    path = pathlib.Path(d) / f"variant_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def inputs():
    g0 = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, H, K, device="cuda", generator=g0).to(dtype)
    k = torch.randn(B, T, H, K, device="cuda", generator=g0).to(dtype)
    v = torch.randn(B, T, HV, V, device="cuda", generator=g0).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=g0) + 3)
    beta = torch.rand(B, T, HV, device="cuda", generator=g0)
    return q, k, v, g, beta


def kernel_times(fn, n: int = 20) -> dict[str, float]:
    """Per-kernel mean µs per call over n calls (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and (e.key.startswith("_") or "kernel" in e.key):  # Triton kernels, not host calls
            out[e.key] = t / n
    return out


def main() -> None:
    ns: dict = {}
    exec(VARIANTS_FILE.read_text(), ns)
    variants = ns["VARIANTS"]
    q, k, v, g, beta = inputs()
    print(f"B={B} T={T} {dtype} module={MODULE}")
    ref = None
    for name, edits in variants.items():
        mod = load_variant(name, edits) if edits else importlib.import_module(MODULE)
        if mod is None:
            continue

        def fn(mod=mod):
            return mod.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True)

        try:
            o, ht = fn()
            if ref is None:  # the first variant (the table's "base") is what errors compare to
                ref = (o.float(), ht)
            err = max(
                ((o.float() - ref[0]).norm() / ref[0].norm()).item(), ((ht - ref[1]).norm() / ref[1].norm()).item()
            )
            times = kernel_times(fn)
        except Exception as exc:  # a variant may not compile; say so and go on
            print(f"{name:28s} ERROR {type(exc).__name__}: {str(exc)[:200]}")
            continue
        parts = "  ".join(f"{key[:34]}={us:8.1f}" for key, us in sorted(times.items()))
        print(f"{name:20s} err={err:.1e} total={sum(times.values()):8.1f} µs  {parts}", flush=True)


if __name__ == "__main__":
    main()
