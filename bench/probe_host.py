"""Host time of one chunked-prefill call, idle GPU and behind a launch backlog.

Host time of one call of clef's chunked op (the Python and launch work before it returns),
on an idle GPU and behind a backlog of queued work, to tell the op's own host cost from the
back-pressure of a full launch queue (which the bench's "host enqueue" of a GPU-bound eager row
includes).  bf16, the Qwen3.5 heads; median of 30 calls each.

Run on the H200 (2026-12-03, docs/performance.md "fourteenth pass"): back to back 161 µs (B1
T512), 261 (B1 T8192), 227 (B1 T32768), 188 (8 packed × 4096).  The "GPU idle" column came out
larger (207-540 µs) and its GPU time includes the wait for the host's launches, so read the
back-to-back column.

    PYTHONPATH=runtime:contract python3 bench/probe_host.py
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch

from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops import chunk_gated_delta_rule

H, HV, K, V = 16, 32, 128, 128
ROWS = {
    "b1_t512": (1, 512, 0),
    "b1_t8192": (1, 8192, 0),
    "b1_t32768": (1, 32768, 0),
    "packed_8x4096": (1, 32768, 8),
}


def measure(name: str, B: int, T: int, seqs: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g, beta = gdn_inputs(gen, torch.device("cuda"), torch.bfloat16, B=B, T=T, H=H, HV=HV, K=K, V=V)
    cu = torch.arange(0, T + 1, T // seqs, dtype=torch.int32, device="cuda") if seqs else None

    def call() -> None:
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True, output_final_state=True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    idle, gpu = [], []
    for _ in range(30):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        call()
        e1.record()
        idle.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        gpu.append(e0.elapsed_time(e1) * 1e-3)
    queued = []
    for _ in range(30):
        t0 = time.perf_counter()
        call()
        queued.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    print(
        f"{name}: host per call, GPU idle {statistics.median(idle) * 1e6:.1f} us; "
        f"back to back (queue filling) {statistics.median(queued) * 1e6:.1f} us; "
        f"GPU time {statistics.median(gpu) * 1e6:.1f} us",
        flush=True,
    )
    if name == "packed_8x4096":  # where the idle host time goes
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            call()
            torch.cuda.synchronize()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for name, (B, T, seqs) in ROWS.items():
        measure(name, B, T, seqs)


if __name__ == "__main__":
    main()
