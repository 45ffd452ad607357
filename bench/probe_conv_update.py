"""Decode conv launch shapes (`UpdateConfig`) timed and checked, against a copy of the same bytes.

`causal_conv1d_update` at B256 (and B1), bf16, D = 8192, W = 4, one new token: the tree's kernel
over `conv_update.UpdateConfig` variants, the kernel of an older tree (``OLD=path/to/conv_update.py``, optional),
FLA's (when importable), and a Triton kernel that only copies as many bytes as the update moves
(16-byte loads and stores, 2048 bytes a program), which is the practical ceiling at this size.

Each variant is checked against the reference (outputs and the shifted pool through a permuted
slot map with a padding row, fresh random inputs), then timed by CUDA-graph replay of one call
per input set over 8 rotated sets (~270 MB at B256, several times the L2), median of 20 replays
a round; the rounds run the variants in a rotated order, and the table (printed last, best
first) gives each variant's median over the rounds and its share of the copy bandwidth
(measured at 1 GiB in the same run).

    PYTHONPATH=runtime:contract python3 bench/probe_conv_update.py [B list]
"""

from __future__ import annotations

import functools
import importlib.util
import os
import statistics
import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from clef_runtime.ops import conv_update as conv
from clef_runtime.reference import conv as ref

D, W, SETS, REPLAYS, ROUNDS = 8192, 4, 8, 20, 7
dt = torch.bfloat16


def draw(B: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "x": torch.randn(B, 1, D, device="cuda", generator=g).to(dt),
        "state": torch.randn(B, D, W - 1, device="cuda", generator=g).to(dt),
        "weight": (torch.randn(D, W, device="cuda", generator=g) * W**-0.5).to(dt),
    }


def graph_time(fn: Callable[[dict], object], sets: list[dict]) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in sets:
            fn(s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in sets:
            fn(s)
    samples = []
    for _ in range(REPLAYS):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        samples.append(e0.elapsed_time(e1) * 1e3 / len(sets))
    return statistics.median(samples)


def check(update: Callable[..., torch.Tensor], B: int, seed: int) -> str:
    """Fresh inputs through a permuted pool of 2B + 1 slots with a padding row."""
    s = draw(2 * B + 1, seed)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(2 * B + 1, generator=g)[:B].to(torch.int32)
    if B > 1:
        idx[B // 2] = -1
    idx = idx.cuda()
    x = s["x"][:B]
    pool, pool_ref = s["state"], s["state"].clone()
    y = torch.full((B, 1, D), float("nan"), dtype=dt, device="cuda")
    y.copy_(update(x, pool, s["weight"], activation="silu", state_indices=idx))
    y_ref = ref.causal_conv1d_update(x, pool_ref, s["weight"], activation="silu", state_indices=idx)
    err = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
    if not torch.equal(pool, pool_ref) or not err < 1e-2:
        return f"WRONG (rel {err:.1e}, pool equal {torch.equal(pool, pool_ref)})"
    return f"{err:.1e}"


def copy_gbps() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = graph_time(lambda s: b.copy_(a), [{}])
    return 2 * a.numel() / (t * 1e-6) / 1e9


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def copy_sets(nbytes: int) -> list[dict]:
    """Source and destination buffers of `nbytes` / 2 each, one pair per input set."""
    n = nbytes // 2 // 2
    return [
        {"src": torch.randn(n, device="cuda").to(dt), "dst": torch.empty(n, dtype=dt, device="cuda")}
        for _ in range(SETS)
    ]


def run_copy(s: dict) -> None:
    n = s["src"].numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](s["src"], s["dst"], n, BLOCK=1024, num_warps=4)


def old_update() -> Callable[..., torch.Tensor] | None:
    path = os.environ.get("OLD")
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("conv_old", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn: Callable[..., torch.Tensor] = mod.causal_conv1d_update
    return fn


def fla_update() -> Callable[..., torch.Tensor] | None:
    try:
        from fla.modules.causal_conv1d import causal_conv1d_update as fla
    except Exception as exc:
        print(f"FLA not importable: {exc}")
        return None
    return fla


def _fixed(cfg: conv.UpdateConfig, D: int) -> conv.UpdateConfig:
    return cfg


def with_config(cfg: conv.UpdateConfig) -> Callable[..., torch.Tensor]:
    def update(*args: object, **kw: object) -> torch.Tensor:
        default = conv._update_config
        conv._update_config = functools.partial(_fixed, cfg)
        try:
            return conv.causal_conv1d_update(*args, **kw)  # type: ignore[arg-type]
        finally:
            conv._update_config = default

    return update


def variants() -> dict[str, Callable[..., torch.Tensor]]:
    out = {"tree default": conv.causal_conv1d_update}
    for cpt, warps in ((8, 1), (8, 4), (4, 2), (4, 8), (2, 4), (2, 8)):
        out[f"cpt{cpt} w{warps}"] = with_config(conv.UpdateConfig(cpt, 32 * warps, warps))
    old = old_update()
    if old is not None:
        out["old tree"] = old
    return out


def parse(argv: list[str]) -> list[int]:
    """``[B list]`` (comma-separated batch sizes; default 256,1)."""
    return [int(b) for b in argv[0].split(",")] if argv else [256, 1]


def main(batches: list[int]) -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    gbps = copy_gbps()
    print(f"copy bandwidth {gbps:.0f} GB/s (1 GiB, graph replay)")
    table: list[tuple[int, float, str, str]] = []
    fla = fla_update()
    for B in batches:
        nbytes = (2 * B * D * (W - 1) + 2 * B * D + D * W) * 2
        floor_us = nbytes / (gbps * 1e3)
        print(f"B{B}: {nbytes / 1e6:.1f} MB, floor {floor_us:.2f} us at the copy bandwidth")
        sets = [draw(B, 100 + i) for i in range(SETS)]
        timed: dict[str, tuple[Callable[[dict], object], list[dict]]] = {}
        errs: dict[str, str] = {}
        for name, upd in variants().items():
            try:
                errs[name] = check(upd, B, 7)
            except Exception as exc:
                errs[name] = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
                continue
            timed[name] = (
                functools.partial(lambda u, s: u(s["x"], s["state"], s["weight"], activation="silu"), upd),
                sets,
            )
        if fla is not None:
            fsets = [
                {**s, "cache": torch.cat([s["state"][..., :1], s["state"]], -1).contiguous()} for s in sets
            ]
            timed["FLA"] = (
                lambda s: fla(x=s["x"], cache=s["cache"], weight=s["weight"], activation="silu"),
                fsets,
            )
            errs["FLA"] = "-"
        timed["copy of the same bytes"] = (run_copy, copy_sets(nbytes))
        errs["copy of the same bytes"] = "-"
        samples: dict[str, list[float]] = {n: [] for n in timed}
        names = list(timed)
        for r in range(ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                fn, ss = timed[name]
                samples[name].append(graph_time(fn, ss))
        for name in errs:
            t = statistics.median(samples[name]) if samples.get(name) else float("nan")
            spread = (
                (max(samples[name]) - min(samples[name])) / t * 100 if samples.get(name) else float("nan")
            )
            table.append((B, t, f"{name} (spread {spread:.1f}%)", errs[name]))
            print(
                f"B{B} {name:28s} {t:8.2f} us  {errs[name]}  rounds {[round(v, 2) for v in samples.get(name, [])]}"
            )
    print("\nB | us | share of copy BW | variant | rel err")
    for B in batches:
        nbytes = (2 * B * D * (W - 1) + 2 * B * D + D * W) * 2
        floor_us = nbytes / (gbps * 1e3)
        for b, t, name, err in sorted((r for r in table if r[0] == B), key=lambda r: (r[1] != r[1], r[1])):
            print(f"B{b} | {t:.2f} | {100 * floor_us / t:.1f}% | {name} | {err}")


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
