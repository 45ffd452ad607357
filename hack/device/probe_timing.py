"""What the chunk probes share (`probe_split.py`, `probe_warmup.py`): relative L2 error, and the
median per-call time of a function over rotated input sets by CUDA events (GRAPH=1: by
CUDA-graph replay)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence

import torch


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
