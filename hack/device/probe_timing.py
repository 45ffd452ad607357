"""What the chunk probes share (`probe_split.py`, `probe_warmup.py`, `probe_fold.py`): the bench's
chunk rows, relative L2 error, the median per-call time of a function over rotated input sets by
CUDA events (GRAPH=1: by CUDA-graph replay), and per-kernel times."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

# the bench's chunk rows: (B, T, packed sequences; 0: none)
CHUNK_ROWS = {
    "b1_t32768": (1, 32768, 0),
    "b1_t8192": (1, 8192, 0),
    "b4_t8192": (4, 8192, 0),
    "b1_t2048": (1, 2048, 0),
    "b1_t131072": (1, 131072, 0),
    "packed_8x4096": (1, 32768, 8),
    "b1_t512": (1, 512, 0),
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def capture(run: Callable[[], object]) -> Callable[[], object]:
    """One CUDA graph of ``run`` (after a warm-up on a side stream); returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def event_samples(run: Callable[[], object], reps: int, calls: int) -> list[float]:
    """Seconds per call of ``run`` (``calls`` calls each), by CUDA events, ``reps`` times."""
    samples = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        torch.cuda.synchronize()
        samples.append(e0.elapsed_time(e1) / 1e3 / calls)
    return samples


def time_it(fn: Callable[[dict], object], sets: Sequence[dict], reps: int = 7) -> float:  # type: ignore[type-arg]
    """With GRAPH=1 in the environment, one CUDA graph of the calls over every set is captured and
    replayed (no host overhead: short rows are host-bound when launched eagerly)."""
    run: Callable[[], object] = lambda: [fn(s) for s in sets]  # noqa: E731
    if os.environ.get("GRAPH") == "1":
        run = capture(run)
    return statistics.median(event_samples(run, reps, len(sets)))


def kernel_times(fn: Callable[[dict], object], sets: Sequence[dict], label: str) -> None:  # type: ignore[type-arg]
    """Print each CUDA kernel's time per call of ``fn`` (torch.profiler, up to 3 sets)."""
    calls = list(sets[:3])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for s in calls:
            fn(s)
        torch.cuda.synchronize()
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and "kernel" in ev.key:
            print(f"  {label} {ev.key[:40]}: {ev.device_time_total / len(calls):.1f} us/call")


def print_ratios(table: Sequence[tuple[str, str, float, float]], base_variant: str) -> None:
    """The rows (row, variant, seconds per call, error) with each variant's speed-up over
    ``base_variant`` of the same row."""
    print(f"\nrow            variant          us/call  {base_variant}/it  rel err")
    base = {r[0]: r[2] for r in table if r[1] == base_variant}
    for name, vname, t, err in table:
        print(f"{name:14s} {vname:14s} {t * 1e6:9.1f}  {base[name] / t:6.3f}x  {err:.1e}")
