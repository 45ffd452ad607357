"""Per-kernel GPU time of the chunked delta rule (and FLA's, when importable), by torch.profiler.

Which launch of clef's `chunk_gated_delta_rule` dominates at the Qwen3.5-9B GDN shapes (B1, 16 key
/ 32 value heads of 128), bf16 or f16: three warm-up calls, then ten calls under the profiler.
GPU only (CUDA activity).

    PYTHONPATH=runtime:contract python3 bench/profile_chunk.py [T] [bf16|f16]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from clef_runtime.ops import chunk_gated_delta_rule

H, HV, K, V = 16, 32, 128, 128
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def parse(argv: list[str]) -> tuple[int, torch.dtype]:
    """``[T] [dtype]`` → (tokens, dtype); an unknown dtype names the choices."""
    T = int(argv[0]) if argv else 32768
    name = argv[1] if len(argv) > 1 else "bf16"
    if name not in DTYPES:
        raise SystemExit(f"dtype {name!r}: use one of {sorted(DTYPES)}")
    return T, DTYPES[name]


def main(argv: list[str]) -> None:
    T, dtype = parse(argv)
    g0 = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, T, H, K, device="cuda", generator=g0).to(dtype)
    k = torch.randn(1, T, H, K, device="cuda", generator=g0).to(dtype)
    v = torch.randn(1, T, HV, V, device="cuda", generator=g0).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda", generator=g0) + 3)
    beta = torch.rand(1, T, HV, device="cuda", generator=g0)

    impls: dict[str, Callable[[], object]] = {
        "clef": lambda: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True)
    }
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


if __name__ == "__main__":
    main(sys.argv[1:])
