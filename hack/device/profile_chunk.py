"""Per-kernel GPU time of clef's chunked delta rule (and FLA's, when importable) at Qwen3.5-9B
shapes, by torch.profiler: which launch dominates, for the next optimisation step.

    PYTHONPATH=runtime python3 hack/device/profile_chunk.py [T] [dtype]
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "runtime")
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule  # noqa: E402

T = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[sys.argv[2] if len(sys.argv) > 2 else "bf16"]
H, HV, K, V = 16, 32, 128, 128
g0 = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, T, H, K, device="cuda", generator=g0).to(dtype)
k = torch.randn(1, T, H, K, device="cuda", generator=g0).to(dtype)
v = torch.randn(1, T, HV, V, device="cuda", generator=g0).to(dtype)
g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda", generator=g0) + 3)
beta = torch.rand(1, T, HV, device="cuda", generator=g0)

impls = {"clef": lambda: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True)}
try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    impls["fla"] = lambda: fla_chunk(
        q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
except Exception as exc:  # the peer is optional
    print(f"fla: not importable ({exc})")

for name, fn in impls.items():
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    print(f"== {name}: T={T} {dtype} (10 calls)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
