"""Correctness of the chunked delta rule per (K, V, dtype, fault, varlen), one process each.

An illegal memory access poisons the CUDA context, so each configuration runs in a process of its
own and one crash cannot hide the others.  Each prints the relative RMS error of the output and the
final state against the reference op (`clef_runtime.reference`); ``fault`` 1 runs the op set with
the catalogue's ``fp16_state_overflow`` (its f16 state must show as an error, not a crash).

    python3 bench/probe_chunk.py                                # the sweep on the GPU
    python3 bench/probe_chunk.py K V dtype fault varlen [cpu]   # one config (what the sweep runs)
    TRITON_INTERPRET=1 python3 bench/probe_chunk.py 16 16 f16 0 1 cpu   # the CPU dry path
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [
    (32, 16, "f16", 0, 0),
    (32, 16, "f16", 1, 0),
    (32, 16, "bf16", 0, 0),
    (32, 16, "f32", 0, 0),
    (16, 16, "f16", 0, 0),
    (32, 32, "f16", 0, 0),
    (64, 64, "f16", 0, 0),
    (128, 128, "f16", 1, 0),
    (128, 128, "bf16", 1, 0),
    (128, 128, "f16", 0, 1),
]
DTYPES = ("f16", "bf16", "f32")


def parse(argv: list[str]) -> tuple[int, int, str, int, int, str]:
    """``K V dtype fault varlen [device]``; a bad field is named."""
    if len(argv) not in (5, 6):
        raise SystemExit("usage: probe_chunk.py K V dtype fault varlen [device]")
    K, V, dt, fault, varlen = argv[:5]
    if dt not in DTYPES:
        raise SystemExit(f"dtype {dt!r}: use one of {DTYPES}")
    device = argv[5] if len(argv) == 6 else "cuda"
    return int(K), int(V), dt, int(fault), int(varlen), device


def one(K: int, V: int, dt: str, fault: int, varlen: int, device: str = "cuda") -> tuple[float, float]:
    """Run one configuration; returns (o rel_rms, state rel_rms) against the reference."""
    if fault:
        os.environ["CLEF_RUNTIME_FAULT"] = "fp16_state_overflow"
    import torch

    from clef_runtime.compare import errors
    from clef_runtime.opset import get_opset
    from clef_runtime.reference import chunk_gated_delta_rule as ref

    chunk_gated_delta_rule = get_opset("triton").chunk_gated_delta_rule  # reads the fault
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dt]
    gen = torch.Generator().manual_seed(0)
    T, H, HV = (200, 1, 2) if device != "cpu" else (40, 1, 2)
    q = torch.randn(1, T, H, K, generator=gen).to(dtype).to(device)
    k = torch.randn(1, T, H, K, generator=gen).to(dtype).to(device)
    v = torch.randn(1, T, HV, V, generator=gen).to(dtype).to(device)
    g = (-torch.rand(1, T, HV, generator=gen)).to(device)
    beta = torch.rand(1, T, HV, generator=gen).to(device)
    cu = torch.tensor([0, 1, T // 3, T], dtype=torch.int32).to(device) if varlen else None
    o, s = chunk_gated_delta_rule(
        q, k, v, g, beta, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=True
    )
    if device != "cpu":
        torch.cuda.synchronize()
    ro, rs = ref(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=True)
    assert s is not None and rs is not None
    e, es = errors(o, ro), errors(s, rs)
    print(f"ok o rel_rms={e.rel_rms:.2e} state rel_rms={es.rel_rms:.2e}")
    return e.rel_rms, es.rel_rms


def sweep() -> None:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "runtime"), str(REPO / "contract"), env.get("PYTHONPATH", "")]
    )
    for cfg in CONFIGS:
        p = subprocess.run(
            [sys.executable, __file__, *map(str, cfg)], capture_output=True, text=True, env=env
        )
        if p.returncode == 0:
            tail = (p.stdout.strip().splitlines() or [""])[-1]
        else:
            errs = [line for line in p.stderr.splitlines() if "rror" in line]
            tail = errs[-1] if errs else p.stderr[-200:]
        print(
            f"K={cfg[0]} V={cfg[1]} {cfg[2]} fault={cfg[3]} varlen={cfg[4]}: rc={p.returncode} {tail[:200]}",
            flush=True,
        )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(*parse(sys.argv[1:]))
    else:
        sweep()
