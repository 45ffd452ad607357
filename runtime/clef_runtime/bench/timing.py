"""Device timing: CUDA events around rounds of calls, eager or replayed from a CUDA graph, and the
copy-bandwidth ceiling measured in the same run.

A *round* is one call per rotated input set (`clef_runtime.bench.rows`), so consecutive calls
never find their inputs in L2.  A *sample* is the time of one round divided by its calls.  The
implementations of a row are timed interleaved (a round of each, in turn, per sample), so clock
or thermal drift during the row affects them alike.

On the CPU (``--allow-cpu``, the Triton interpreter) the host clock stands in for the events:
those numbers exercise the code path and mean nothing else.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Round = Callable[[], None]

# A row whose device time per call is under this multiple of the host's enqueue time per call is
# "host-bound" when launched eagerly: the GPU waited on Python, so the number is launch overhead.
HOST_BOUND_FACTOR = 1.5


@dataclass(frozen=True)
class Stats:
    """Per-call seconds of every sample, and the host's enqueue time per call (eager only)."""

    samples: tuple[float, ...]
    host: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile, ``q`` in [0, 1]."""
        xs = sorted(self.samples)
        if len(xs) == 1:
            return xs[0]
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    @property
    def p10(self) -> float:
        return self.quantile(0.10)

    @property
    def p90(self) -> float:
        return self.quantile(0.90)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the run-to-run noise a difference must exceed to mean anything."""
        m = self.median
        return (self.p90 - self.p10) / m if m > 0 else 0.0

    @property
    def host_median(self) -> float | None:
        return statistics.median(self.host) if self.host else None

    @property
    def host_bound(self) -> bool:
        h = self.host_median
        return h is not None and self.median < HOST_BOUND_FACTOR * h

    def record(self) -> dict[str, object]:
        out: dict[str, object] = {
            "median_s": self.median,
            "p10_s": self.p10,
            "p90_s": self.p90,
            "min_s": min(self.samples),
            "max_s": max(self.samples),
            "spread": self.spread,
            "samples": len(self.samples),
        }
        if self.host:
            out["host_enqueue_s"] = self.host_median
            out["host_bound"] = self.host_bound
        return out


# fewer interleaved pairs than this give no paired range (`paired_ratios`)
MIN_PAIRS = 5


def paired_ratios(base: Stats, other: Stats) -> Stats | None:
    """``other``'s time over ``base``'s, sample by sample: `time_rounds` takes sample j of every
    implementation in the same interleaved pass, so each ratio compares two calls made side by
    side, and drift that moves both cancels in it.  Its p10 above 1 says ``base`` was faster in
    nine pairs of ten, a statement the two medians and their spreads cannot make.  None when the
    samples are not paired (different counts) or fewer than MIN_PAIRS."""
    if len(base.samples) != len(other.samples) or len(base.samples) < MIN_PAIRS:
        return None
    return Stats(tuple(o / b for o, b in zip(other.samples, base.samples, strict=True)))


@dataclass(frozen=True)
class Budget:
    """How long to sample each row: at least ``min_samples``, then until ``seconds`` have passed
    (all implementations together) or ``max_samples`` are in."""

    seconds: float
    min_samples: int
    max_samples: int
    warmup_rounds: int


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(
    rounds: Sequence[Round],
    calls: Sequence[int],
    device: torch.device,
    budget: Budget,
    idle: bool = False,
) -> list[Stats]:
    """Time ``rounds[i]`` (``calls[i]`` calls each), interleaved, and return per-call stats.  The
    order rotates every sample (sample j starts with round j mod n): the round after another
    starts behind its queued kernels, the first after a sync from an idle GPU, and a fixed order
    would give one implementation the idle start every time (its host time hidden behind the
    others' kernels, or theirs behind its own).  With ``idle`` every round starts from an idle
    GPU (a sync before it): its events then also count the time the GPU waits on the host."""
    n = len(rounds)
    dev: list[list[float]] = [[] for _ in range(n)]
    host: list[list[float]] = [[] for _ in range(n)]
    t0 = time.perf_counter()
    batch = 1
    while True:
        taken = len(dev[0])
        if device.type == "cuda":
            marks: list[tuple[int, torch.cuda.Event, torch.cuda.Event, float]] = []
            for j in range(batch):
                first = (taken + j) % n
                for i in (*range(first, n), *range(first)):
                    fn = rounds[i]
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    if idle:
                        torch.cuda.synchronize(device)
                    h0 = time.perf_counter()
                    start.record()
                    fn()
                    end.record()
                    marks.append((i, start, end, time.perf_counter() - h0))
            torch.cuda.synchronize(device)
            for i, start, end, h in marks:
                dev[i].append(start.elapsed_time(end) * 1e-3 / calls[i])
                host[i].append(h / calls[i])
        else:
            for j in range(batch):
                first = (taken + j) % n
                for i in (*range(first, n), *range(first)):
                    h0 = time.perf_counter()
                    rounds[i]()
                    dev[i].append((time.perf_counter() - h0) / calls[i])
        count = len(dev[0])
        elapsed = time.perf_counter() - t0
        if count >= budget.max_samples or (count >= budget.min_samples and elapsed >= budget.seconds):
            break
        # grow the batch so that syncs are rare, never past the budget's sample cap
        batch = max(1, min(2 * batch, 32, budget.max_samples - count))
    if device.type == "cuda":
        return [Stats(tuple(d), tuple(h)) for d, h in zip(dev, host, strict=True)]
    return [Stats(tuple(d)) for d in dev]


def host_sync(fn: Round) -> str | None:
    """Call ``fn`` once with PyTorch's sync debug mode raising, and return what stopped it if it
    synchronised with the host (``.item()``, ``.tolist()``, a copy to the host: FLA's and
    FlashQLA's packed calls read their offsets so), else None.  A CUDA-graph capture of such a
    call fails, and a capture that fails part-way can leave the process's CUDA state unsafe
    for the calls after it (torch 2.11's `CUDAGraph::capture_end` could leave the caching
    allocator routing to the abandoned graph's pool: pytorch/pytorch#180395, #190308), so the
    bench asks this before it captures anything."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as e:
        if "synchronizing" not in str(e):
            raise
        return str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return None


def capture_graph(fn: Round, device: torch.device, warmup: int = 2) -> Round:
    """Capture ``fn`` (after ``warmup`` eager calls on a side stream, as CUDA graphs require) and
    return the replay.  The graph's memory pool lives as long as the returned function."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)

    def replay() -> None:
        graph.replay()

    return replay


@dataclass(frozen=True)
class CopyBandwidth:
    """A device-to-device copy of ``nbytes``: bytes moved = read + written = ``2 * nbytes``."""

    nbytes: int
    stats: Stats

    @property
    def bytes_per_s(self) -> float:
        return 2 * self.nbytes / self.stats.median

    def record(self) -> dict[str, object]:
        return {"copy_bytes": self.nbytes, "bytes_moved": 2 * self.nbytes, "bytes_per_s": self.bytes_per_s,
                **self.stats.record()}  # fmt: skip


def measure_copy_bandwidth(device: torch.device, nbytes: int, samples: int) -> CopyBandwidth:
    """The memory ceiling of this run: ``dst.copy_(src)`` on random data, median of ``samples``."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    synchronize(device)

    def one() -> None:
        dst.copy_(src)

    budget = Budget(seconds=0.0, min_samples=samples, max_samples=samples, warmup_rounds=0)
    (stats,) = time_rounds([one], [1], device, budget)
    return CopyBandwidth(4 * n, stats)
