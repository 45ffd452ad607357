"""Where a chunked call's host time goes, part by part, and what a Triton launch costs the host.

`probe_host.py` gave one number a call; this splits it.  Every part is timed exclusively (a
wrapper's time less its wrapped children's): the op's own Python (`chunk_gated_delta_rule`,
`run_split`, `prepare`), the input checks, each `torch.empty`, each Triton launch
(`JITFunction.run`: argument binding, specialisation, cache lookup, the launch).  The wrappers
add about a microsecond each, so the plain call is timed too, in rounds interleaved with the
instrumented ones.  Then the baselines: an empty Triton kernel of the walk's argument count
launched through `kernel[grid](...)` and through its compiled object directly (the launcher
alone), and `torch.empty`.  bf16, the Qwen3.5 heads, calls back to back; medians.

    PYTHONPATH=runtime:contract python3 hack/device/probe_host_parts.py [LABEL]

Where the op has plans (`delta_rule_plan`, 2026-12-04) each row is timed four ways in every
round, in rotated order: the plain path (``fast_launch.ENABLED`` off: checks, allocations and
Triton's launcher every call), the planned path, and both instrumented.  The planned outputs are
compared with the plain ones to the bit.  Run it with an older checkout's ``runtime`` first on
PYTHONPATH for the "before" numbers (only the plain path exists there).  The last lines are a
table: median host µs a call (p10-p90) per row and mode.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

import clef_runtime.ops.delta_rule_chunk as dc
import clef_runtime.ops.delta_rule_chunk_split as ds
from clef_runtime.inputs import gdn_inputs

H, HV, K, V = 16, 32, 128, 128
# name: (B, T, packed sequences)
ROWS = {
    "b1_t512": (1, 512, 0),
    "b1_t2048": (1, 2048, 0),
    "b1_t8192": (1, 8192, 0),
    "b1_t32768": (1, 32768, 0),
    "b4_t8192": (4, 8192, 0),
    "packed_8x4096": (1, 32768, 8),
}
CALLS = 40
ROUNDS = 8
HAS_PLANS = hasattr(dc, "plan_key")
if HAS_PLANS:
    from clef_runtime.ops import delta_rule_plan as dp
    from clef_runtime.ops import fast_launch

acc: collections.Counter[str] = collections.Counter()
counts: collections.Counter[str] = collections.Counter()
_stack = [0]


def timed(label: str | Callable[..., str], f: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **kw: Any) -> Any:
        _stack.append(0)
        t = time.perf_counter_ns()
        try:
            return f(*a, **kw)
        finally:
            elapsed = time.perf_counter_ns() - t
            child = _stack.pop()
            name = label if isinstance(label, str) else label(*a)
            acc[name] += elapsed - child
            counts[name] += 1
            _stack[-1] += elapsed

    return wrapper


class Instrumented:
    """Swaps the wrappers in while active."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def swap(self, owner: Any, attr: str, label: str | Callable[..., str]) -> None:
        orig = getattr(owner, attr)
        self.saved.append((owner, attr, orig))
        setattr(owner, attr, timed(label, orig))

    def __enter__(self) -> Instrumented:
        self.swap(JITFunction, "run", lambda self, *a: f"launch {self.__name__}")
        self.swap(torch, "empty", "torch.empty")
        self.swap(dc, "checked_inputs", "checked_inputs")
        self.swap(dc, "chunk_gated_delta_rule", "chunk_gated_delta_rule (own)")
        self.swap(dc, "prepare", "prepare (own)")
        self.swap(ds, "prepare", "prepare (own)")
        self.swap(ds, "run_split", "run_split (own)")
        self.swap(ds, "tma_eligible", "tma_eligible")
        self.swap(ds, "default_segments", "default_segments")
        self.swap(dc, "tensor_core_dots", "tensor_core_dots")
        if HAS_PLANS:
            self.swap(dc, "plan_key", "plan_key")
            self.swap(dp.Plan, "__call__", "Plan.__call__ (own)")
            self.swap(fast_launch.Recorded, "launch", lambda self, *a: f"launch via run() {self.name}")
            self.swap(dc, "carve", "carve (own)")
            for plan in dc._PLANS.values():
                for pl in plan.launches:
                    if pl.c_launch is not None:
                        self.saved.append((pl, "c_launch", pl.c_launch))
                        object.__setattr__(
                            pl, "c_launch", timed(f"direct launch {pl.recorded.name}", pl.c_launch)
                        )
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, orig in reversed(self.saved):
            object.__setattr__(owner, attr, orig) if attr == "c_launch" else setattr(owner, attr, orig)


def inputs(B: int, T: int, seqs: int) -> tuple[Any, ...]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g, beta = gdn_inputs(gen, torch.device("cuda"), torch.bfloat16, B=B, T=T, H=H, HV=HV, K=K, V=V)
    cu = torch.arange(0, T + 1, T // seqs, dtype=torch.int32, device="cuda") if seqs else None
    return q, k, v, g, beta, cu


def calls(args: tuple[Any, ...], n: int) -> list[float]:
    q, k, v, g, beta, cu = args
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        dc.chunk_gated_delta_rule(
            q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True, output_final_state=True
        )
        out.append((time.perf_counter_ns() - t) / 1e3)
    return out


def set_mode(planned: bool) -> None:
    if HAS_PLANS:
        fast_launch.ENABLED = planned


def rows() -> dict[str, dict[str, list[float]]]:
    data = {name: inputs(*shape) for name, shape in ROWS.items()}
    modes = ["plain", "planned"] if HAS_PLANS else ["plain"]
    for args in data.values():
        for mode in modes:
            set_mode(mode == "planned")
            calls(args, 3)
    torch.cuda.synchronize()
    if HAS_PLANS:  # the planned path computes what the plain one does, to the bit
        for name, args in data.items():
            q, k, v, g, beta, cu = args
            outs = []
            for mode in modes:
                set_mode(mode == "planned")
                outs.append(
                    dc.chunk_gated_delta_rule(
                        q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True, output_final_state=True
                    )
                )
            same = torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
            print(f"{name}: planned == plain to the bit: {same}; plans held: {len(dc._PLANS)}")
    times: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    parts: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    variants = [(m, instr) for m in modes for instr in (False, True)]
    for r in range(ROUNDS):
        for name, args in data.items():
            for mode, instr in variants[r % len(variants) :] + variants[: r % len(variants)]:
                set_mode(mode == "planned")
                torch.cuda.synchronize()
                if not instr:
                    times[name][mode] += calls(args, CALLS)
                    continue
                acc.clear()
                counts.clear()
                with Instrumented():
                    times[name][mode + "+instr"] += calls(args, CALLS)
                parts[(name, mode)].update({k: v / 1e3 for k, v in acc.items()})
                parts[(name, mode)].update({f"#{k}": c for k, c in counts.items()})
    torch.cuda.synchronize()
    set_mode(True)
    n = CALLS * ROUNDS
    for name in data:
        for mode in modes:
            p = times[name][mode]
            q10, q90 = statistics.quantiles(p, n=10)[0], statistics.quantiles(p, n=10)[-1]
            print(
                f"\n{name} [{mode}]: median {statistics.median(p):.1f} us (p10 {q10:.1f}, p90 {q90:.1f}); "
                f"instrumented median {statistics.median(times[name][mode + '+instr']):.1f} us"
            )
            pt = parts[(name, mode)]
            total = sum(v for k, v in pt.items() if not k.startswith("#"))
            for k, v in sorted(
                ((k, v) for k, v in pt.items() if not k.startswith("#")), key=lambda kv: -kv[1]
            ):
                print(f"  {k:45s} {v / n:7.1f} us a call  x{pt['#' + k] / n:.0f}")
            print(f"  {'(sum of parts)':45s} {total / n:7.1f} us a call")
    return times


@triton.jit
def _empty_kernel(
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
    i0, i1, i2, i3, i4, i5, i6, i7, i8, i9,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr,
    C5: tl.constexpr, C6: tl.constexpr, C7: tl.constexpr, C8: tl.constexpr, C9: tl.constexpr,
    C10: tl.constexpr, C11: tl.constexpr, C12: tl.constexpr, C13: tl.constexpr, C14: tl.constexpr,
    C15: tl.constexpr, C16: tl.constexpr, C17: tl.constexpr, C18: tl.constexpr, C19: tl.constexpr,
):  # fmt: skip
    pass


def median_us(f: Callable[[], Any], n: int = 2000) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        f()
        out.append((time.perf_counter_ns() - t) / 1e3)
    return statistics.median(out)


def baselines() -> None:
    x = torch.empty(1 << 20, device="cuda")
    ptrs = [x[i * 64 :] for i in range(15)]
    ints = [4096 + i for i in range(10)]
    consts = {f"C{i}": (i % 3 == 0) if i < 10 else 64 for i in range(20)}
    grid = (32, 4, 1)
    kernel = _empty_kernel[grid](*ptrs, *ints, **consts)
    torch.cuda.synchronize()
    args = [*ptrs, *ints, *consts.values()]
    stream = torch.cuda.current_stream().cuda_stream
    from triton import knobs

    def direct() -> None:
        md = kernel.launch_metadata(grid, stream, *args)
        kernel.run(*grid, stream, kernel.function, kernel.packed_metadata, md,
                   knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)  # fmt: skip

    def raw() -> None:
        kernel.run(*grid, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)

    launcher = kernel.run
    c_args = (*grid, stream, kernel.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
              kernel.packed_metadata, None, None, None, *args)  # fmt: skip

    def c_only() -> None:
        launcher.launch(*c_args)

    def stream_query() -> None:
        if HAS_PLANS:
            fast_launch.current_stream()

    for label, f in (
        (
            "empty kernel, kernel[grid](25 args + 20 constexprs)",
            lambda: _empty_kernel[grid](*ptrs, *ints, **consts),
        ),
        ("the same, compiled kernel's run() with launch_metadata", direct),
        ("the same, compiled kernel's run() bare", raw),
        ("the same, the launcher's C function alone", c_only),
        ("fast_launch.current_stream() (device and stream)", stream_query),
        ("x.data_ptr()", lambda: x.data_ptr()),
        (
            "torch.empty(1, 512, 32, 128, bf16)",
            lambda: torch.empty(1, 512, 32, 128, dtype=torch.bfloat16, device="cuda"),
        ),
        (
            "torch.empty((1, 32, 4096), f32)",
            lambda: torch.empty((1, 32, 4096), dtype=torch.float32, device="cuda"),
        ),
        ("x.add_(1) (one torch launch)", lambda: x.add_(1)),
    ):
        for _ in range(200):
            f()
        torch.cuda.synchronize()
        print(f"  {label:60s} {median_us(f):6.2f} us")
        torch.cuda.synchronize()


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else ("after" if HAS_PLANS else "before")
    print(
        torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, "label", label
    )
    times = rows()
    print("\nbaselines (median host time a call, back to back):")
    baselines()
    print(f"\nTABLE {label}: host us a call, back to back, median (p10-p90) of {CALLS * ROUNDS}")
    for name, by_mode in times.items():
        cells = []
        for mode in ("plain", "planned"):
            if mode in by_mode:
                p = by_mode[mode]
                d = statistics.quantiles(p, n=10)
                cells.append(f"{mode} {statistics.median(p):6.1f} ({d[0]:.1f}-{d[-1]:.1f})")
        print(f"TABLE {label} {name:15s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
