"""Which step makes clef's packed call fault once FLA is in the process.

Run on the H200 (2026-12-03, fourteenth pass): none of the four steps faulted (|o| 1.4268e+02
each time), and the bench's row ran with FLA once the bench stopped capturing calls that sync
(docs/performance.md, "fourteenth pass").  Kept to re-check if the fault comes back.

On the H200 (2026-12-03) the bench's `chunk_packed_8x4096` row broke the CUDA context with FLA
loaded (no FlashQLA), and with CUDA_LAUNCH_BLOCKING=1 the bench named clef's timing as the call
that hit the illegal address; clef alone ran the row (753.1 µs), and so did clef with FlashQLA
(`probe_packed.py`).  This runs clef's packed call (8 × 4096, bf16, the Qwen3.5 heads) after one
of three steps, each in a process of its own:

    none            nothing else (the control)
    import          FLA imported, not called (prints Triton's allocator after the import)
    run             FLA's packed call on the same tensors first (int64 offsets), then clef's
    failed-capture  no FLA: a CUDA-graph capture that fails (a host sync inside it, as FLA's and
                    FlashQLA's packed calls do when the bench switches host-bound rows to graph
                    replay), then clef's packed call eagerly, then its dense B1 T32768 call

    for s in none import run failed-capture; do
        CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=runtime:contract:/tmp/site python3 hack/device/diag_fla_packed.py $s
    done

"import" faulting points at something FLA's import changes; "run" alone at FLA's call leaving
memory that clef then reads (or a fault of FLA's reported late); "failed-capture" at the process
state a failed capture leaves (torch 2.11's `CUDAGraph::capture_end` can leave the caching
allocator routing to the graph's pool: pytorch/pytorch#180395, #190308), which the bench would
then have to avoid (no graph switch for rows whose peers sync on the host); none of them at the
bench's rotation of input sets (run `clef-runtime bench --rows chunk_packed_8x4096` with and
without FLA, and read its notes for "timed by CUDA-graph replay instead").
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"  # as the bench sets it: FLA's own Triton kernels

from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule

T, H, HV, K, V, SEQS = 32768, 16, 32, 128, 128, 8


def main(step: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16, generator=gen)
    g = F.logsigmoid(torch.randn(1, T, HV, device="cuda", generator=gen) + 3)
    beta = torch.rand(1, T, HV, device="cuda", generator=gen)
    cu = torch.arange(0, T + 1, T // SEQS, device="cuda", dtype=torch.int32)
    if step == "failed-capture":
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                float(beta.sum())  # a host sync: the capture fails
        except Exception as e:
            print(f"{step}: the capture failed as meant: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        del graph
    if step in ("import", "run"):
        import triton.runtime._allocation as allocation
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla

        print(f"{step}: Triton's allocator after FLA's import: {type(allocation._allocator.get()).__name__}")
        if step == "run":
            fla(q, k, v, g, beta, cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True, output_final_state=True)
            torch.cuda.synchronize()
            print(f"{step}: FLA's call ran")
    for _ in range(3):  # as the bench does: a checked call, then timed ones
        o, _h = chunk_gated_delta_rule(
            q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True, output_final_state=True
        )
        torch.cuda.synchronize()
    print(f"{step}: clef's call ran 3 times, |o| = {float(o.float().norm()):.4e}")
    if step == "failed-capture":  # the dense call after it too (B1 T32768: split, TMA)
        o, _h = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, output_final_state=True)
        torch.cuda.synchronize()
        print(f"{step}: clef's dense call ran, |o| = {float(o.float().norm()):.4e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "none")
