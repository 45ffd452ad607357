"""Decode conv launch shapes (`conv.UpdateConfig`) timed and checked, against FLA's.

`causal_conv1d_update` launch shapes at B256 (and B1), bf16, D = 8192, W = 4, one new token:
the tree's kernel over `UpdateConfig` variants, the kernel of an older tree (``OLD=path/to/conv.py``,
optional) and FLA's (when importable), with the copy bandwidth measured in the same run (take the bench's: this one copies once, cold).

Each variant is checked against the reference (outputs and the shifted pool, fresh random
inputs) and timed by CUDA-graph replay of one call per input set over 8 rotated sets (~270 MB
at B256, several times the L2), median of 30 replays.  The table prints last, best first.

    PYTHONPATH=runtime:contract python3 bench/probe_conv_update.py [B list]
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import statistics
import sys
from collections.abc import Callable

import torch

from clef_runtime.ops import conv
from clef_runtime.reference import conv as ref

D, W, SETS, REPLAYS = 8192, 4, 8, 30
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
    s = draw(B, seed)
    pool = s["state"]
    pool_ref = pool.clone()
    y = update(s["x"], pool, s["weight"], activation="silu")
    y_ref = ref.causal_conv1d_update(s["x"], pool_ref, s["weight"], activation="silu")
    err = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
    if not torch.equal(pool, pool_ref) or not err < 1e-2:
        return f"WRONG (rel {err:.1e}, pool equal {torch.equal(pool, pool_ref)})"
    return f"{err:.1e}"


def copy_gbps() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = graph_time(lambda s: b.copy_(a), [{}])
    return 2 * a.numel() / (t * 1e-6) / 1e9


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

    def run(x, cache, weight, activation):  # type: ignore[no-untyped-def]
        return fla(x=x, cache=cache, weight=weight, activation=activation)[0]

    return run


def _fixed(cfg: conv.UpdateConfig, B: int, D: int) -> conv.UpdateConfig:
    return cfg


def _call(update: Callable[..., torch.Tensor], s: dict) -> object:
    return update(s["x"], s["state"], s["weight"], activation="silu")


def variants() -> list[conv.UpdateConfig]:
    out = []
    for bd, nw in itertools.product([64, 128, 256, 512, 1024], [1, 2, 4, 8]):
        if bd // (32 * nw) in (1, 2, 4, 8):
            out.append(conv.UpdateConfig(1, bd, nw))
    for bd, nw, rows in itertools.product([128, 256], [2, 4], [2, 4]):
        out.append(conv.UpdateConfig(rows, bd, nw))
    return out


def parse(argv: list[str]) -> list[int]:
    """``[B list]`` (comma-separated batch sizes; default 256,1)."""
    return [int(b) for b in argv[0].split(",")] if argv else [256, 1]


def main(batches: list[int]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    gbps = copy_gbps()
    print(f"copy bandwidth {gbps:.0f} GB/s")
    default = conv._update_config
    old, fla = old_update(), fla_update()
    table: list[tuple[int, float, str, str]] = []
    for B in batches:
        floor_us = (2 * B * D * (W - 1) + 2 * B * D) * 2 / (gbps * 1e3)
        sets = [draw(B, 100 + i) for i in range(SETS)]
        print(f"B{B}: byte floor {floor_us:.2f} us at the copy bandwidth")

        def clef(s: dict) -> object:
            return conv.causal_conv1d_update(s["x"], s["state"], s["weight"], activation="silu")

        for cfg in variants():
            name = f"rows{cfg.rows} bd{cfg.block_d} w{cfg.num_warps}"
            conv._update_config = functools.partial(_fixed, cfg)
            try:
                err = check(conv.causal_conv1d_update, B, 7)
                t = graph_time(clef, sets)
            except Exception as exc:
                err, t = f"FAILED {type(exc).__name__}: {str(exc)[:80]}", float("nan")
            table.append((B, t, name, err))
            print(f"B{B} {name:28s} {t:8.2f} us  {err}", flush=True)
        conv._update_config = default
        extra: list[tuple[str, Callable[..., torch.Tensor] | None]] = [
            ("tree default", conv.causal_conv1d_update),
            ("old tree", old),
        ]
        for name, upd in extra:
            if upd is None:
                continue
            err = check(upd, B, 7)
            t = graph_time(functools.partial(_call, upd), sets)
            table.append((B, t, name, err))
        if fla is not None:
            fsets = [
                {**s, "cache": torch.cat([s["state"][..., :1], s["state"]], -1).contiguous()} for s in sets
            ]
            t = graph_time(lambda s: fla(s["x"], s["cache"], s["weight"], "silu"), fsets)
            table.append((B, t, "FLA 0.6.0", "-"))
    print("\nB | us | share of copy BW | variant | rel err")
    for B in batches:
        floor_us = (2 * B * D * (W - 1) + 2 * B * D) * 2 / (gbps * 1e3)
        rows = sorted((r for r in table if r[0] == B), key=lambda r: (r[1] != r[1], r[1]))
        for b, t, name, err in rows[:12] + [r for r in rows[12:] if not r[2].startswith("rows")]:
            print(f"B{b} | {t:.2f} | {100 * floor_us / t:.1f}% | {name} | {err}")


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
