"""Where a chunked call's host time goes, part by part, and what a Triton launch costs the host.

`probe_host.py` gave one number a call; this splits it.  Every part is timed exclusively (a
wrapper's time less its wrapped children's): the op's own Python (`chunk_gated_delta_rule`,
`run_split`, `prepare`), the input checks, each `torch.empty`, each Triton launch
(`JITFunction.run`: argument binding, specialisation, cache lookup, the launch).  The wrappers
add about a microsecond each, so the plain call is timed too, in rounds interleaved with the
instrumented ones.  Then the baselines: an empty Triton kernel of the walk's argument count
launched through `kernel[grid](...)` and through its compiled object directly (the launcher
alone), and `torch.empty`.  bf16, the Qwen3.5 heads, calls back to back; medians.

    PYTHONPATH=runtime:contract python3 hack/device/probe_host_parts.py

Written in session 15 (2026-12-03) when that session's device time was already spent: not yet
run on a GPU.  It is the first step of docs/performance.md's "next steps" on host time.
"""

from __future__ import annotations

import collections
import statistics
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
ROWS = {"b1_t512": (512, 0), "b1_t2048": (2048, 0), "b1_t32768": (32768, 0), "packed_8x4096": (32768, 8)}
CALLS = 50
ROUNDS = 6

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
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, orig in reversed(self.saved):
            setattr(owner, attr, orig)


def inputs(T: int, seqs: int) -> tuple[Any, ...]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g, beta = gdn_inputs(gen, torch.device("cuda"), torch.bfloat16, B=1, T=T, H=H, HV=HV, K=K, V=V)
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


def rows() -> None:
    data = {name: inputs(T, seqs) for name, (T, seqs) in ROWS.items()}
    for args in data.values():
        calls(args, 3)
    torch.cuda.synchronize()
    plain: dict[str, list[float]] = collections.defaultdict(list)
    instr: dict[str, list[float]] = collections.defaultdict(list)
    parts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for _ in range(ROUNDS):
        for name, args in data.items():
            plain[name] += calls(args, CALLS)
            torch.cuda.synchronize()
            acc.clear()
            counts.clear()
            with Instrumented():
                instr[name] += calls(args, CALLS)
            torch.cuda.synchronize()
            parts[name].update({k: v / 1e3 for k, v in acc.items()})
            parts[name].update({f"#{k}": c for k, c in counts.items()})
    n = CALLS * ROUNDS
    for name in data:
        p = plain[name]
        print(
            f"\n{name}: plain median {statistics.median(p):.1f} us (p10 {statistics.quantiles(p, n=10)[0]:.1f}, "
            f"p90 {statistics.quantiles(p, n=10)[-1]:.1f}); instrumented median {statistics.median(instr[name]):.1f} us"
        )
        total = sum(v for k, v in parts[name].items() if not k.startswith("#"))
        for k, v in sorted(
            ((k, v) for k, v in parts[name].items() if not k.startswith("#")), key=lambda kv: -kv[1]
        ):
            print(f"  {k:45s} {v / n:7.1f} us a call  x{parts[name]['#' + k] / n:.0f}")
        print(f"  {'(sum of parts)':45s} {total / n:7.1f} us a call")


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

    for label, f in (
        (
            "empty kernel, kernel[grid](25 args + 20 constexprs)",
            lambda: _empty_kernel[grid](*ptrs, *ints, **consts),
        ),
        ("the same, compiled kernel's run() with launch_metadata", direct),
        ("the same, compiled kernel's run() bare", raw),
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
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    rows()
    print("\nbaselines (median host time a call, back to back):")
    baselines()


if __name__ == "__main__":
    main()
