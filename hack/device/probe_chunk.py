"""Probe the chunked delta rule on a GPU config by config, each in its own process (an illegal
memory access poisons the CUDA context, so one crash must not hide the others).

    python3 hack/device/probe_chunk.py            # the sweep, one line per config
    python3 hack/device/probe_chunk.py K V dtype fault varlen   # one config (what the sweep runs)
"""

from __future__ import annotations

import os
import subprocess
import sys

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


def one(K: int, V: int, dt: str, fault: int, varlen: int) -> None:
    import torch

    sys.path.insert(0, "runtime")
    from clef_runtime.compare import errors
    from clef_runtime.reference import chunk_gated_delta_rule as ref
    from clef_runtime.opset import get_opset

    if fault:
        os.environ["CLEF_RUNTIME_FAULT"] = "fp16_state_overflow"
    chunk_gated_delta_rule = get_opset("triton").chunk_gated_delta_rule  # reads the fault
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dt]
    gen = torch.Generator().manual_seed(0)
    T, H, HV = 200, 1, 2
    q = torch.randn(1, T, H, K, generator=gen).to(dtype).cuda()
    k = torch.randn(1, T, H, K, generator=gen).to(dtype).cuda()
    v = torch.randn(1, T, HV, V, generator=gen).to(dtype).cuda()
    g = (-torch.rand(1, T, HV, generator=gen)).cuda()
    beta = torch.rand(1, T, HV, generator=gen).cuda()
    cu = torch.tensor([0, 1, 70, T], dtype=torch.int32).cuda() if varlen else None
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=True)
    torch.cuda.synchronize()
    ro, rs = ref(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu, use_qk_l2norm=True)
    e, es = errors(o, ro), errors(s, rs)
    print(f"ok o rel_rms={e.rel_rms:.2e} state rel_rms={es.rel_rms:.2e}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        K, V, dt, fault, varlen = sys.argv[1:6]
        one(int(K), int(V), dt, int(fault), int(varlen))
        sys.exit(0)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for cfg in CONFIGS:
        p = subprocess.run([sys.executable, __file__, *map(str, cfg)], capture_output=True, text=True, env=env)
        tail = (p.stdout.strip().splitlines() or [""])[-1] if p.returncode == 0 else (
            [l for l in p.stderr.splitlines() if "Error" in l or "error" in l][-1:] or [p.stderr[-200:]])[0]
        print(f"K={cfg[0]} V={cfg[1]} {cfg[2]} fault={cfg[3]} varlen={cfg[4]}: rc={p.returncode} {tail[:200]}", flush=True)
