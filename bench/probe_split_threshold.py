"""Short B1 prompts: the three-launch design against the split design's fused walk, GPU and host.

Where `delta_rule_chunk_split.DEFAULT_MIN_SPLIT_TOKENS` comes from.  For each B1 prompt length
(bf16, Qwen3.5 heads, q/k normalised in the kernel): the chunked op's default path, the
three-launch design forced (the split design's `takes_default_path` answering no), and the
split design's walk unsplit (one segment) at a few V blocks, warps and stages, each checked
against the three-launch output (relative L2) and timed by CUDA-graph replay of one call per
input set over rotated sets (≥ 200 MB, several times the L2), interleaved as the bench times
(`clef_runtime.bench.timing`), median of 40.  Then the host time of one planned call of the
default path and of the forced three launches, back to back, in alternated rounds of 240 calls
beside 240 calls of ``x.add_(1)`` (the host's launch cost: it drifts between the lent hosts, so
compare rows in units of it).

    PYTHONPATH=runtime:contract python3 bench/probe_split_threshold.py [T list, default 512,768,1024,1536]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

from clef_runtime.bench.timing import Budget, capture_graph, time_rounds
from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops import delta_rule_chunk as dc
from clef_runtime.ops import delta_rule_chunk_split as dcs

H, HV, K, V = 16, 32, 128, 128
SAMPLES, ROUNDS, CALLS = 40, 8, 240
SET_BYTES = 200_000_000
TOLERANCE = 2e-2  # relative L2 of o between two bf16 designs (each ~3e-3 from the float64 reference)
# the split design's walk, one segment: (V block, warps, stages)
WALKS = [(32, 4, 2), (64, 4, 2)]
Inputs = tuple[torch.Tensor, ...]
_TAKES = dcs.takes_default_path
_mode = ["default"]


def parse(argv: list[str]) -> list[int]:
    if not argv:
        return [512, 768, 1024, 1536]
    try:
        ts = [int(x) for x in argv[0].split(",")]
    except ValueError:
        raise SystemExit(f"T list {argv[0]!r}: comma-separated token counts, e.g. 512,1024") from None
    if any(t < 1 for t in ts):
        raise SystemExit(f"T list {argv[0]!r}: every T must be ≥ 1")
    return ts


def route(mode: str) -> None:
    """The default path ("default") or the three launches forced ("three"); plans are per layout,
    not per route, so a change of route forgets them."""
    if _mode[0] != mode:
        dc._PLANS.clear()
        dc._LAST.clear()
        dc._SEEN.clear()
        _mode[0] = mode
    dcs.takes_default_path = _TAKES if mode == "default" else (lambda *a, **k: False)


def draw(T: int, n: int) -> list[Inputs]:
    gen = torch.Generator(device="cuda").manual_seed(T)
    dev = torch.device("cuda")
    return [gdn_inputs(gen, dev, torch.bfloat16, B=1, T=T, H=H, HV=HV, K=K, V=V) for _ in range(n)]


def variants() -> dict[str, Callable[[Inputs], tuple[torch.Tensor, torch.Tensor | None]]]:
    def through(mode: str) -> Callable[[Inputs], tuple[torch.Tensor, torch.Tensor | None]]:
        def call(s: Inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
            route(mode)
            return dc.chunk_gated_delta_rule(*s, use_qk_l2norm=True, output_final_state=True)

        return call

    def fused(
        bv: int, warps: int, stages: int
    ) -> Callable[[Inputs], tuple[torch.Tensor, torch.Tensor | None]]:
        def call(s: Inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
            return dcs.chunk_gated_delta_rule_split(
                *s,
                use_qk_l2norm=True,
                output_final_state=True,
                segments=1,
                block_v=bv,
                warps=warps,
                stages=stages,
            )

        return call

    out = {"three": through("three"), "default": through("default")}
    out.update({f"P1 bv{bv} w{w} s{st}": fused(bv, w, st) for bv, w, st in WALKS})
    return out


def gpu_times(T: int) -> dict[str, tuple[float, float]]:
    """Variant → (median µs a call by graph replay, relative L2 of o against the three launches)."""
    per_set = T * (2 * H * K + HV * V) * 2 + T * HV * 8
    sets = draw(T, max(8, min(96, -(-SET_BYTES // per_set))))
    dev = sets[0][0].device
    names: list[str] = []
    replays: list[Callable[[], None]] = []
    errs: dict[str, float] = {}
    ref = None
    for name, fn in variants().items():
        o, _ = fn(sets[0])
        ref = o.float() if ref is None else ref
        errs[name] = ((o.float() - ref).norm() / ref.norm()).item()

        def one_round(fn: Callable[[Inputs], object] = fn) -> None:
            for s in sets:
                fn(s)

        replays.append(capture_graph(one_round, dev))
        names.append(name)
    route("default")
    budget = Budget(seconds=0.0, min_samples=SAMPLES, max_samples=SAMPLES, warmup_rounds=0)
    stats = time_rounds(replays, [len(sets)] * len(replays), dev, budget)
    return {n: (st.median * 1e6, errs[n]) for n, st in zip(names, stats, strict=True)}


def host_times(T: int) -> dict[str, float]:
    """Route (and "x.add_") → median µs of host time a call over the rounds."""
    s = draw(T, 1)[0]
    x = torch.zeros(1, device="cuda")
    modes = ["three", "default"]
    out: dict[str, list[float]] = {m: [] for m in [*modes, "x.add_"]}
    for r in range(ROUNDS):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            route(mode)
            for _ in range(5):  # the second call records the plan
                dc.chunk_gated_delta_rule(*s, use_qk_l2norm=True, output_final_state=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                x.add_(1)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            for _ in range(CALLS):
                dc.chunk_gated_delta_rule(*s, use_qk_l2norm=True, output_final_state=True)
            t3 = time.perf_counter()
            torch.cuda.synchronize()
            out["x.add_"].append((t1 - t0) / CALLS * 1e6)
            out[mode].append((t3 - t2) / CALLS * 1e6)
    route("default")
    return {m: statistics.median(v) for m, v in out.items()}


def main(argv: list[str]) -> int:
    ts = parse(argv)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, split from {dcs.DEFAULT_MIN_SPLIT_TOKENS} tokens"
    )
    lines = []
    failed = False
    for T in ts:
        gpu = gpu_times(T)
        host = host_times(T)
        base = gpu["three"][0]
        for name, (us, err) in gpu.items():
            bad = not err <= TOLERANCE  # NaN fails too
            failed |= bad
            note = f"  CHECK FAILED (> {TOLERANCE})" if bad else ""
            lines.append(
                f"T{T:<6} {name:<16} {us:8.1f} µs  three/this {base / us:5.3f}x  rel L2 {err:.1e}{note}"
            )
        lines.append(
            f"T{T:<6} host a call      three {host['three']:.1f} µs, default {host['default']:.1f} µs, "
            f"x.add_ {host['x.add_']:.1f} µs"
        )
        print(*lines[-len(gpu) - 1 :], sep="\n", flush=True)
    print("\n".join(["", "summary:", *lines]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
