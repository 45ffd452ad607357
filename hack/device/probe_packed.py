"""The bench's `chunk_packed_8x4096` row (8 packed sequences of 4096 tokens, bf16, the Qwen3.5
shapes), clef against FlashQLA in a process of their own (no FLA: with both peers loaded the
row faults), three ways: CUDA-graph replay, eager CUDA events, and the sum of each call's kernel
times (torch.profiler: what the GPU spends, host overhead excluded).

FlashQLA's graph capture failed in the bench with "tensor_cache miss during CUDA graph capture:
_calc_intra_cp_seqs": its per-offsets cache missed because the bench rotates input sets, each
with its own offsets tensor.  Here every set shares one offsets tensor, so the eager warm-up
fills the cache that the capture then reads.

    PYTHONPATH=/tmp/pkgs:runtime:contract python3 hack/device/probe_packed.py
"""

from __future__ import annotations

import statistics

import torch
from probe_timing import capture, event_samples  # hack/device, the script's folder
from torch.profiler import ProfilerActivity, profile

from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule

H, HV, K, V, T, SEQS, SETS, REPS = 16, 32, 128, 128, 32768, 8, 2, 30
dt = torch.bfloat16


def main() -> None:
    import flash_qla

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "flash_qla", flash_qla.__version__)
    cu32 = torch.arange(0, T + 1, T // SEQS, dtype=torch.int32, device="cuda")
    cu64 = cu32.long()
    sets = []
    for i in range(SETS):
        gen = torch.Generator(device="cuda").manual_seed(10 + i)
        q, k, v, g, beta = gdn_inputs(gen, torch.device("cuda"), dt, B=1, T=T, H=H, HV=HV, K=K, V=V)
        sets.append({"q": q, "k": k, "v": v, "g": g, "beta": beta})

    def clef(s: dict) -> tuple:
        return chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta"], cu_seqlens=cu32,
                                      output_final_state=True, use_qk_l2norm=True)  # fmt: skip

    def fqla(s: dict) -> tuple:
        return flash_qla.chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta"], cu_seqlens=cu64,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip

    impls = {"clef": clef, "flashqla": fqla}
    outs = {name: fn(sets[0]) for name, fn in impls.items()}  # compile (TileLang: ~1 min)
    torch.cuda.synchronize()
    o_c, h_c = outs["clef"]
    o_f, h_f = outs["flashqla"]
    rel_o = float((o_f.float() - o_c.float()).norm() / o_c.float().norm())
    rel_h = float((h_f.float() - h_c.float()).norm() / h_c.float().norm())
    print(f"FlashQLA vs clef: rel L2 o {rel_o:.2e}, final state {rel_h:.2e}")

    rows = []
    for name, fn in impls.items():

        def eager(fn=fn) -> None:  # type: ignore[no-untyped-def]
            for s in sets:
                fn(s)

        eager()
        ev = [t * 1e6 for t in event_samples(eager, REPS, SETS)]
        try:
            gr = [t * 1e6 for t in event_samples(capture(eager), REPS, SETS)]
            graph_txt = (
                f"{statistics.median(gr):9.1f} us ±{100 * (max(gr) - min(gr)) / statistics.median(gr):.1f}%"
            )
        except Exception as exc:  # report why and go on with the other two numbers
            graph_txt = f"capture failed: {type(exc).__name__}: {str(exc)[:100]}"
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                eager()
            torch.cuda.synchronize()
        kern = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA") / (
            5 * SETS
        )
        rows.append((name, graph_txt, statistics.median(ev), kern))
        for e in prof.key_averages():
            if e.device_type.name == "CUDA":
                print(
                    f"  {name} {e.key[:60]}: {e.device_time_total / (5 * SETS):.1f} us/call, {e.count // (5 * SETS)}x"
                )
    print("\nimpl      graph replay            eager events   kernel sum (profiler)")
    for name, g_txt, ev_med, kern in rows:
        print(f"{name:9s} {g_txt:24s} {ev_med:9.1f} us   {kern:9.1f} us")


if __name__ == "__main__":
    main()
