"""Is the split walk bound by the bytes it moves from L2 into shared memory?  A copy-only kernel
with the walk's grid and tile traffic: 2 programs per SM of 4 warps, each stepping through its
own rows and loading, per step, the walk's tiles by TMA (`tl.make_tensor_descriptor`, pipelined
by Triton over a 2-stage loop): k and q [64, 128], v, T and Aqk [64, 64] of 16-bit values (56 KB; f16, whose dots the interpreter gets right), and
nothing else.  The source is either L2-resident (a few MB, every program re-reading it) or
DRAM-sized (1 GB, each program its own rows).  Prints TB/s per case and the walk's own rate for
comparison (docs/performance.md, eleventh pass: the walk at B1 T32768 moves ~2.2 GB in ~445 µs,
4.9 TB/s).

    PYTHONPATH=runtime:contract python3 hack/device/probe_l2.py
    TRITON_INTERPRET=1 ... probe_l2.py tiny   # the kernel on the CPU, checked against torch
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation


@triton.jit
def _tiles_kernel(src, out, rows, row_stride, STEPS: tl.constexpr, WIDE: tl.constexpr, NARROW: tl.constexpr):
    """Program p reads STEPS chunks of 64 rows from row (p · STEPS · 64) mod rows of each of
    the source's five parts: [64, WIDE] tiles of two (k, q) and [64, NARROW] tiles of three (v,
    T, Aqk), by TMA; out[p] is the sum of k qᵀ + v Tᵀ + Aqk Tᵀ over the steps (so nothing is
    optimised away, and every load is a dot operand that Triton pipelines, as in the walk)."""
    p = tl.program_id(0)
    part = rows * row_stride  # five parts of the source, one per tile kind (k, q, v, T, Aqk)
    d_k = tl.make_tensor_descriptor(src, [rows, WIDE], [row_stride, 1], [64, WIDE])
    d_q = tl.make_tensor_descriptor(src + part, [rows, WIDE], [row_stride, 1], [64, WIDE])
    d_v = tl.make_tensor_descriptor(src + 2 * part, [rows, NARROW], [row_stride, 1], [64, NARROW])
    d_t = tl.make_tensor_descriptor(src + 3 * part, [rows, NARROW], [row_stride, 1], [64, NARROW])
    d_a = tl.make_tensor_descriptor(src + 4 * part, [rows, NARROW], [row_stride, 1], [64, NARROW])
    acc = tl.zeros([64, 64], dtype=tl.float32)
    first = (p * STEPS * 64) % rows
    for s in range(0, STEPS):  # a constexpr bound: the interpreter cannot take a runtime one
        row = ((first + s * 64) % rows).to(tl.int32)
        k = d_k.load([row, 0])
        q = d_q.load([row, 0])
        v = d_v.load([row, 0])
        t = d_t.load([row, 0])
        a = d_a.load([row, 0])
        # every tile feeds a dot, as in the walk (Triton pipelines the loads of dot operands)
        acc += tl.dot(k, tl.trans(q)) + tl.dot(v, tl.trans(t)) + tl.dot(a, tl.trans(t))
    r = tl.arange(0, 64)
    tl.store(out + p * 64 * 64 + r[:, None] * 64 + r[None, :], acc)


def run(src: torch.Tensor, programs: int, steps: int, warps: int = 4) -> torch.Tensor:
    """Runs the kernel over `src` ([5, rows, 128]: the five parts)."""
    out = torch.empty(programs, 64, 64, dtype=torch.float32, device=src.device)

    def scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=src.device)

    token = _allocation._allocator.set(scratch)
    try:
        _tiles_kernel[(programs,)](
            src,
            out,
            src.shape[1],
            src.stride(1),
            STEPS=steps,
            WIDE=128,
            NARROW=64,
            num_warps=warps,
            num_stages=2,
        )
    finally:
        _allocation._allocator.reset(token)
    return out


def check_tiny() -> None:
    """The kernel against torch on a small source (CPU interpreter or GPU)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.randn(5, 256, 128, device=dev).to(torch.float16)
    got = run(src, programs=3, steps=5)
    for p in range(3):
        rows = [(p * 5 * 64 + s * 64) % 256 for s in range(5)]
        k, q, v, t, a = (torch.cat([src[i, r : r + 64].float() for r in rows]) for i in range(5))
        want = sum(
            k[j : j + 64] @ q[j : j + 64].T + (v[j : j + 64, :64] + a[j : j + 64, :64]) @ t[j : j + 64, :64].T
            for j in range(0, 5 * 64, 64)
        )
        torch.testing.assert_close(got[p].cpu(), want.cpu(), rtol=1e-3, atol=1e-2)
    print("tiny: the kernel's products match torch's")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "tiny":
        check_tiny()
        return
    check_tiny()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile_bytes = 2 * 64 * 128 * 2 + 3 * 64 * 64 * 2  # 56 KB per step, the walk's
    for name, mb in (("L2-resident 8 MB", 8), ("L2-resident 32 MB", 32), ("DRAM 1 GB", 1024)):
        rows = mb * 2**20 // (5 * 128 * 2) // 64 * 64
        src = torch.randn(5, rows, 128, device="cuda").to(torch.float16)
        for per_sm, warps in ((2, 4), (1, 8), (3, 4)):
            programs, steps = per_sm * sms, 132
            run(src, programs, steps, warps)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                run(src, programs, steps, warps)
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) / 10 * 1e3
            moved = programs * steps * tile_bytes
            print(
                f"{name}: {per_sm} programs/SM x {warps} warps, {programs} programs x {steps} steps,"
                f" {moved / 1e9:.2f} GB in {us:.1f} us = {moved / us / 1e6:.2f} TB/s",
                flush=True,
            )
        del src
    print("the walk (tenth pass, B1 T32768): ~2.2 GB in ~445 us = ~4.9 TB/s")


if __name__ == "__main__":
    main()
