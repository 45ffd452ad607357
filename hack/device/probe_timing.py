"""What the chunk probes share (`probe_split.py`, `probe_warmup.py`): relative L2 error, and the
median per-call time of a function over rotated input sets by CUDA events."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def time_it(fn: Callable[[dict], object], sets: Sequence[dict], reps: int = 7) -> float:  # type: ignore[type-arg]
    samples = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for s in sets:
            fn(s)
        e1.record()
        torch.cuda.synchronize()
        samples.append(e0.elapsed_time(e1) / 1e3 / len(sets))
    return statistics.median(samples)
