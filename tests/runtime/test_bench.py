"""`clef-runtime bench` on the CPU: argument parsing, the byte/FLOP floors of every row against
hand-computed small cases, the check that keeps a wrong kernel from being timed, the table, the
CPU refusal, and one cheap row end to end under the Triton interpreter."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clef_runtime.bench import add_bench_parser, measure, run_bench_command
from clef_runtime.bench.command import CPU_REFUSAL, Options
from clef_runtime.bench.fla_peer import FlaPeer
from clef_runtime.bench.floors import (
    CHUNK,
    QWEN35_9B,
    Dims,
    chunk_floor,
    chunk_flops,
    conv_floor,
    conv_update_floor,
    gated_rmsnorm_floor,
    gating_floor,
    l2norm_floor,
    layer_core_floor,
    layer_decode_floor,
    projection_params,
    recurrent_floor,
)
from clef_runtime.bench.measure import Env, bench_row, single_calls
from clef_runtime.bench.report import ImplResult, RowResult, fmt_time, number_notes, table_lines
from clef_runtime.bench.rows import ROWS, Context, Impl, Row, Setup, Tensors, rotation_sets, select_rows
from clef_runtime.bench.timing import Budget, Stats, paired_ratios, time_rounds
from clef_runtime.opset import get_opset

# A small GDN shape for hand arithmetic: D = 2*H*K + HV*V = 2*2*8 + 4*16 = 96.
SMALL = Dims(H=2, HV=4, K=8, V=16, W=4, hidden=32)
BF16 = 2


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clef-runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    return parser.parse_args(["bench", *argv])


# ---- arguments ------------------------------------------------------------------------------------


def test_defaults() -> None:
    o = Options.from_args(parse())
    assert (o.rows, o.quick, o.no_fla, o.json, o.dtype, o.device, o.allow_cpu, o.mode, o.seed) == (
        None,
        False,
        False,
        None,
        "bf16",
        "cuda",
        False,
        "auto",
        0,
    )
    assert (o.no_flashqla, o.split, o.no_qk_l2norm) == (False, False, False)


def test_every_option() -> None:
    o = Options.from_args(
        parse(
            "--rows", "chunk, recurrent_b1,,", "--quick", "--no-fla", "--json", "out/b.json", "--dtype", "f16",
            "--device", "cuda:1", "--allow-cpu", "--mode", "graph", "--seconds", "0.5", "--seed", "3",
            "--no-flashqla", "--split", "--no-qk-l2norm",
        )
    )  # fmt: skip
    assert o.rows == ["chunk", "recurrent_b1"] and o.no_flashqla and o.split and o.no_qk_l2norm
    assert (o.quick, o.no_fla, o.json, o.dtype, o.device, o.allow_cpu, o.mode, o.seconds, o.seed) == (
        True,
        True,
        "out/b.json",
        "f16",
        "cuda:1",
        True,
        "graph",
        0.5,
        3,
    )


@pytest.mark.parametrize("argv", [["--dtype", "f64"], ["--mode", "fast"], ["--seed", "x"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2


def test_row_selection() -> None:
    names = lambda rows: [r.name for r in rows]  # noqa: E731
    rows, bad = select_rows(["chunk"])
    assert names(rows) == [
        "chunk_b1_t32768",
        "chunk_b1_t8192",
        "chunk_b4_t8192",
        "chunk_b1_t2048_graph",
        "chunk_b1_t131072",
        "chunk_packed_8x4096",
        "chunk_b1_t512_graph",
    ]
    assert bad == []
    rows, _ = select_rows(["recurrent_*", "gdn_gating"])
    assert names(rows) == [
        "recurrent_b1",
        "recurrent_b32",
        "recurrent_b128",
        "recurrent_b512",
        "gdn_gating_t8192",
    ]
    rows, _ = select_rows(["causal_conv1d"])  # an op name
    assert names(rows) == ["conv_b1_t32768"]
    rows, bad = select_rows(["l2norm_t8192", "nope"])
    assert names(rows) == ["l2norm_t8192"] and bad == ["nope"]
    assert names(select_rows(None)[0]) == [r.name for r in ROWS]


def test_every_row_of_the_brief_is_there() -> None:
    want = {
        "chunk_b1_t32768": (1, 32768, False),
        "chunk_b1_t8192": (1, 8192, False),
        "chunk_b4_t8192": (4, 8192, False),
        "chunk_b1_t2048_graph": (1, 2048, True),
        "chunk_b1_t131072": (1, 131072, False),
        "chunk_packed_8x4096": (1, 32768, False),
        "chunk_b1_t512_graph": (1, 512, True),
        "recurrent_b1": (1, 1, True),
        "recurrent_b32": (32, 1, True),
        "recurrent_b128": (128, 1, True),
        "recurrent_b512": (512, 1, True),
        "conv_b1_t32768": (1, 32768, False),
        "conv_update_b1": (1, 1, True),
        "conv_update_b256": (256, 1, True),
        "gated_rmsnorm_t8192": (1, 8192, False),
        "gdn_gating_t8192": (1, 8192, False),
        "l2norm_t8192": (1, 8192, False),
        "layer_decode_b1_graph": (1, 1, True),
    }
    by_name = {r.name: r for r in ROWS}
    for name, (B, T, graph) in want.items():
        assert (*by_name[name].full, by_name[name].graph) == (B, T, graph), name


def test_packed_rows_share_one_offsets_tensor() -> None:
    """Every input set of the packed row holds the same offsets tensors (as a model's GDN layers
    share their batch's): FLA and FlashQLA cache what they read from it on the host by tensor
    identity, so after a first call they no longer sync, and the row can be captured in a graph."""
    row = next(r for r in ROWS if r.name == "chunk_packed_8x4096")
    ctx = Context(
        device=torch.device("cpu"), dtype=torch.bfloat16, dims=SMALL, ops=get_opset("reference"), fla=None
    )
    setup = row.build(ctx, *row.tiny)
    a, b = setup.make_set(1), setup.make_set(2)
    assert a["cu_seqlens"] is b["cu_seqlens"] and a["cu_seqlens64"] is b["cu_seqlens64"]
    assert a["cu_seqlens"].dtype == torch.int32 and a["cu_seqlens64"].dtype == torch.int64
    assert a["cu_seqlens"].tolist() == list(range(0, row.tiny[1] + 1, row.tiny[1] // 8))
    assert not torch.equal(a["q"], b["q"])  # the inputs still differ per set


def test_chunk_rows_without_in_kernel_normalisation() -> None:
    """``--no-qk-l2norm``: q and k arrive L2-normalised and clef is called without normalising
    (the peers likewise, `use_qk_l2norm_in_kernel=False`); the row says so."""
    from dataclasses import replace
    from types import SimpleNamespace

    row = next(r for r in ROWS if r.name == "chunk_b1_t512_graph")
    ctx = Context(
        device=torch.device("cpu"), dtype=torch.float32, dims=SMALL, ops=get_opset("reference"), fla=None
    )
    calls: list[dict[str, object]] = []

    def chunk(*args: object, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(kw)
        return torch.ones(1), torch.ones(1)

    ops = SimpleNamespace(chunk_gated_delta_rule=chunk)
    for norm in (True, False):
        setup = row.build(replace(ctx, ops=ops, qk_l2norm=norm), *row.tiny)
        s = setup.make_set(1)
        setup.clef.run(s)
        assert calls[-1]["use_qk_l2norm"] is norm
        unit = torch.allclose(s["q"].norm(dim=-1), torch.ones(()), atol=1e-3)
        assert unit is not norm and ("arrive L2-normalised" in setup.notes[0]) is not norm


# ---- floors -------------------------------------------------------------------------------------


def test_model_dims() -> None:
    assert QWEN35_9B.D == 2 * 16 * 128 + 32 * 128 == 8192
    assert QWEN35_9B.qkv_split == (2048, 2048, 4096)
    # in_proj_qkv 8192*4096 + in_proj_z 4096*4096 + in_proj_b/a 2*32*4096 + out_proj 4096*4096
    assert projection_params(QWEN35_9B) == 33_554_432 + 16_777_216 + 262_144 + 16_777_216 == 67_371_008
    assert SMALL.D == 96


def test_chunk_floor() -> None:
    f = chunk_floor(SMALL, B=2, T=3, elt=BF16)
    # q, k: 2*3 tokens * 2 heads * 8 * 2 B = 192 each; v and o: 6 * 4 * 16 * 2 = 768 each;
    # g, beta: 6 * 4 * 4 B = 96 each; final state: 2 seqs * 4 * 8 * 16 * 4 B = 4096
    assert dict(f.terms) == {
        "q": 192,
        "k": 192,
        "v": 768,
        "g": 96,
        "beta": 96,
        "o": 768,
        "final_state": 4096,
    }
    assert f.bytes == 6208
    # per token, C = 64: key heads 2 * 4*C*K = 2 * 2048 = 4096;
    # value heads 4 * (2*C*K + 4*C*V + 6*K*V) = 4 * (1024 + 4096 + 768) = 23552; 6 tokens
    assert CHUNK == 64
    assert f.flops == 6 * (4096 + 23552) == 165_888
    assert chunk_flops(SMALL, 1, 1, chunk=16) == 2 * 4 * 16 * 8 + 4 * (2 * 16 * 8 + 4 * 16 * 16 + 6 * 8 * 16)


def test_chunk_floor_at_model_shape() -> None:
    f = chunk_floor(QWEN35_9B, B=1, T=32768, elt=BF16)
    # q, k 128 MiB each, v and o 256 MiB each, g and beta 4 MiB each, final state 2 MiB
    assert f.bytes == 2 * 2**27 + 2 * 2**28 + 2 * 2**22 + 2**21
    assert f.flops == 32768 * (16 * 4 * 64 * 128 + 32 * (2 * 64 * 128 + 4 * 64 * 128 + 6 * 128 * 128))


def test_recurrent_floor() -> None:
    f = recurrent_floor(SMALL, B=3, elt=BF16)
    # q, k: 3 * 2 * 8 * 2 = 96; v, o: 3 * 4 * 16 * 2 = 384; g, beta: 3 * 4 * 4 = 48;
    # state read and write: 3 * 4 * 8 * 16 * 4 = 6144 each
    assert f.bytes == 96 + 96 + 384 + 48 + 48 + 384 + 6144 + 6144 == 13344
    assert f.terms["state_read"] == f.terms["state_write"] == 6144
    assert f.flops == 3 * 4 * 7 * 8 * 16 == 10752


def test_conv_floors() -> None:
    f = conv_floor(SMALL, B=2, T=5, elt=BF16)
    # x, y: 2 * 5 * 96 * 2 = 1920 each; weight 96 * 4 * 2 = 768; final state 2 * 96 * 3 * 2 = 1152
    assert dict(f.terms) == {"x": 1920, "weight": 768, "y": 1920, "final_state": 1152}
    assert f.flops == 2 * 4 * 2 * 5 * 96 == 7680
    u = conv_update_floor(SMALL, B=3, elt=BF16)
    # x, y: 3 * 96 * 2 = 576 each; weight 768; state 3 * 96 * 3 * 2 = 1728 read and written
    assert u.bytes == 576 + 768 + 576 + 1728 + 1728 == 5376
    assert u.flops == 2 * 4 * 3 * 96 == 2304


def test_elementwise_floors() -> None:
    n = gated_rmsnorm_floor(SMALL, T=5, elt=BF16)
    # x, z, y: 5 * 4 * 16 * 2 = 640 each; weight 16 * 2 = 32
    assert n.bytes == 3 * 640 + 32 == 1952 and n.flops is None
    g = gating_floor(SMALL, T=5, elt=BF16)
    # a, b: 5 * 4 * 2 = 40 each; A_log, dt_bias 4 * 4 = 16 each; g, beta 5 * 4 * 4 = 80 each
    assert g.bytes == 40 + 40 + 16 + 16 + 80 + 80 == 272 and g.flops is None
    assert l2norm_floor(SMALL, T=5, elt=BF16).bytes == 2 * (5 * 2 * 8 * 2) == 320
    assert gating_floor(SMALL, T=5, elt=4).bytes == 80 + 80 + 16 + 16 + 80 + 80  # f32 activations


def test_layer_floors() -> None:
    f = layer_decode_floor(SMALL, B=2, elt=BF16)
    # weights: (96 + 64 + 2 * 4) * 32 + 32 * 64 = 7424 params * 2 B = 14848
    # x, out: 2 * 32 * 2 = 128 each; conv weight 768; A_log, dt_bias 16 each; norm weight 32;
    # conv state 2 * 96 * 3 * 2 = 1152 read and written; state 2 * 4 * 8 * 16 * 4 = 4096 read and written
    assert f.terms["projection_weights"] == 14848
    assert f.bytes == 128 + 14848 + 768 + 16 + 16 + 32 + 2 * 1152 + 2 * 4096 + 128 == 26432
    # matmuls 2 * B * 7424, conv 2 * W * B * D, recurrence B * HV * 7 * K * V
    assert f.flops == 2 * 2 * 7424 + 2 * 4 * 2 * 96 + 2 * 4 * 7 * 8 * 16 == 38400
    c = layer_core_floor(SMALL, B=2, elt=BF16)
    # mixed 2 * 96 * 2 = 384; z and out 2 * 64 * 2 = 256 each; a, b 2 * 4 * 2 = 16 each; + the same
    # small weights and states as above (768 + 16 + 16 + 32 + 2304 + 8192 = 11328)
    assert c.bytes == 384 + 256 + 16 + 16 + 11328 + 256 == 12256
    assert c.flops == 1536 + 7168


def test_rotation_sets() -> None:
    MiB = 2**20
    # 2 MiB sets (decode B1 state), 180 MiB to pass between two uses: 90 sets
    assert rotation_sets(2 * MiB, 0, 180 * MiB, 8, 256, 1 << 40) == 90
    # a set bigger than the target still rotates min_sets, if memory allows
    assert rotation_sets(800 * MiB, 0, 180 * MiB, 8, 256, 1 << 40) == 8
    assert rotation_sets(800 * MiB, 0, 180 * MiB, 8, 256, 1600 * MiB) == 2
    # shared weights count towards what passes between uses
    assert rotation_sets(2 * MiB, 134 * MiB, 180 * MiB, 1, 256, 1 << 40) == 2
    assert rotation_sets(1, 0, 10**9, 1, 256, 1 << 40) == 256
    assert rotation_sets(10, 0, 10, 1, 256, 5) == 1


# ---- stats and table -------------------------------------------------------------------------------


def test_stats() -> None:
    s = Stats(tuple(float(i) for i in range(1, 12)), host=(1.0,) * 11)  # 1..11
    assert s.median == 6.0
    assert s.p10 == pytest.approx(2.0) and s.p90 == pytest.approx(10.0)
    assert s.spread == pytest.approx(8.0 / 6.0)
    assert not s.host_bound  # device 6 > 1.5 * host 1
    assert Stats((1.0, 1.0), host=(0.9, 0.9)).host_bound
    assert Stats((3.0,)).quantile(0.9) == 3.0


def test_fmt_time() -> None:
    assert fmt_time(2.5e-6) == "2.50 µs"
    assert fmt_time(12.34e-6) == "12.3 µs"
    assert fmt_time(2.08e-3) == "2.080 ms"
    assert fmt_time(1.5) == "1.500 s"
    assert fmt_time(None) == "-"


def _row(name: str, clef: float | None, fla: float | None, status: str = "ok") -> RowResult:
    r = RowResult(name, "op", "B1 T8", chunk_floor(SMALL, 1, 8, BF16), show_tflops=name.startswith("chunk"))
    r.status, r.mode = status, "eager"
    if clef is not None:
        r.clef = ImplResult("clef", Stats((clef * 0.99, clef, clef * 1.01)))
    if fla is not None:
        r.fla = ImplResult("fla", Stats((fla,)))
    else:
        r.fla = ImplResult("fla", na="not loaded (--no-fla)")
    r.notes = ["a note"] if fla is None else []
    return r


def test_table() -> None:
    rows = [_row("chunk_x", 1e-3, 2e-3), _row("recurrent_y", 5e-6, None), _row("bad", None, None, "mismatch")]
    texts, per_row = number_notes(rows)
    assert texts == ["a note"] and per_row == {"chunk_x": [], "recurrent_y": [1], "bad": [1]}
    copy_bw = 1e9  # bytes per second: the chunk row's 4864-byte floor (B1 T8) is 4.86 µs
    assert rows[0].floor.bytes == 256 + 256 + 1024 + 128 + 128 + 1024 + 2048 == 4864
    lines = table_lines(rows, copy_bw, per_row)
    assert lines[0].split() == [
        "row", "case", "mode", "floor", "clef", "FLA", "FLA/clef", "clef", "BW", "FLA", "BW",
        "clef", "TF/s", "FLA", "TF/s", "host", "µs/call", "notes",
    ]  # fmt: skip
    chunk, rec, bad = lines[1:]
    # spread of (0.99, 1, 1.01) ms: p10 0.992, p90 1.008 -> 1.6%
    assert "1.000 ms ±1.6%" in chunk and "2.000 ms ±0.0%" in chunk and "2.00x" in chunk
    # share of copy BW: 4864 B / 1 ms / 1 GB/s = 0.5%; FLA (2 ms) 0.2%
    assert "4.86 µs" in chunk and "0.5%" in chunk and "0.2%" in chunk
    assert "5.00 µs" in rec and "n/a" in rec and rec.endswith("1")
    assert bad.count("MISMATCH") == 2
    # right-aligned columns end where their header ends
    ratio_end = lines[0].index("FLA/clef") + len("FLA/clef")
    assert chunk.index("2.00x") + len("2.00x") == ratio_end
    assert rec[ratio_end - 1] == "-" and bad[ratio_end - 1] == "-"


def test_host_time_per_call_in_eager_and_idle_rows_only() -> None:
    """The host column: clef / FLA / each peer's enqueue time per call where calls were launched
    eagerly (back to back or from idle), "-" for one with no time, blank for graph replays."""
    r = RowResult("chunk_x", "op", "B1 T8", chunk_floor(SMALL, 1, 8, BF16))
    r.clef = ImplResult("clef", Stats((1e-3, 1e-3), (160e-6, 164e-6)))
    r.fla = ImplResult("fla", na="not loaded (--no-fla)")
    r.peers["flashqla"] = ImplResult("flashqla", Stats((2e-3,), (297.3e-6,)))
    for mode in ("eager", "idle"):
        r.mode = mode
        header, line = table_lines([r], 1e9)
        assert "host µs/call" in header and "162.0 / - / 297.3" in line
    r.mode = "graph"
    header, line = table_lines([r], 1e9)
    assert "162.0" not in line and "297.3" not in line


def test_the_order_rotates_every_sample() -> None:
    """Sample j starts with implementation j mod n: none always runs first (from an idle GPU, its
    host time hidden behind nothing) or always behind another's queued kernels."""
    order: list[int] = []
    rounds = [lambda i=i: order.append(i) for i in range(3)]
    stats = time_rounds(rounds, [1, 1, 1], torch.device("cpu"), Budget(0.0, 4, 4, 0))
    assert [len(s.samples) for s in stats] == [4, 4, 4]
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]


def test_paired_ratios() -> None:
    """Sample j of each implementation comes from the same interleaved pass: the pair-by-pair
    ratio cancels drift that moves both (here clef 1.00-1.30 ms drifting, the peer 1.1× it in
    every pair), which the medians' spreads cannot show."""
    clef = Stats(tuple(1e-3 * (1.0 + 0.05 * j) for j in range(7)))
    peer = Stats(tuple(1.1 * t for t in clef.samples))
    paired = paired_ratios(clef, peer)
    assert paired is not None
    assert paired.p10 == pytest.approx(1.1) and paired.p90 == pytest.approx(1.1)
    assert clef.spread > 0.2  # the medians alone: 1.10x inside a 23% spread
    # the ratios are taken pair by pair, by sample index: a peer 1.3x and 1.0x clef in turn
    turns = Stats(tuple(t * (1.3 if j % 2 == 0 else 1.0) for j, t in enumerate(clef.samples)))
    by_pair = paired_ratios(clef, turns)
    assert by_pair is not None and by_pair.p10 == pytest.approx(1.0) and by_pair.p90 == pytest.approx(1.3)
    # unpaired (different counts) or too few pairs: no range
    assert paired_ratios(clef, Stats(peer.samples[:6])) is None
    assert paired_ratios(Stats(clef.samples[:4]), Stats(peer.samples[:4])) is None
    r = RowResult("chunk_x", "op", "B1 T8", chunk_floor(SMALL, 1, 8, BF16))
    r.clef, r.fla = ImplResult("clef", clef), ImplResult("fla", peer)
    r.peers["flashqla"] = ImplResult("flashqla", Stats(tuple(0.9 * t for t in clef.samples)))
    line = table_lines([r], 1e9)[1]
    assert "1.10x (1.10-1.10)" in line and "0.90x (0.90-0.90)" in line
    rec = r.record(1e9)
    assert rec["fla"]["paired_ratio_over_clef"]["p10"] == pytest.approx(1.1)
    assert rec["peers"]["flashqla"]["paired_ratio_over_clef"]["p90"] == pytest.approx(0.9)
    assert "paired_ratio_over_clef" not in rec["clef"]


# ---- the check keeps a wrong kernel from being timed ------------------------------------------------


def _fake_row(
    fla_factor: float, clef_nan: bool = False, peers: dict[str, float] | None = None
) -> tuple[Row, Context, Env]:
    """``peers``: name -> factor of implementations beside clef (×2) and FLA."""

    def build(ctx: Context, B: int, T: int) -> Setup:
        def make_set(seed: int) -> Tensors:
            g = torch.Generator().manual_seed(seed)
            return {"x": torch.randn(B, T, 8, generator=g)}

        def clef(s: Tensors) -> Tensors:
            y = s["x"] * 2.0
            return {"y": y.fill_(float("nan")) if clef_nan else y}

        def fla(s: Tensors) -> Tensors:
            return {"y": s["x"] * fla_factor}

        return Setup(
            case=f"B{B} T{T}",
            floor=l2norm_floor(SMALL, T, 4),
            make_set=make_set,
            clef=Impl("clef", clef),
            fla=Impl("fla", fla),
            fla_missing=None,
            peers=[Impl(n, lambda s, f=f: {"y": s["x"] * f}) for n, f in (peers or {}).items()],
        )

    row = Row("fake", "fake_op", False, (1, 4), (1, 4), build)
    ctx = Context(device=torch.device("cpu"), dtype=torch.float32, dims=SMALL, ops=None, fla=FlaPeer("test"))  # type: ignore[arg-type]
    env = Env(
        device=torch.device("cpu"),
        tiny=True,
        dims=SMALL,
        budget=Budget(0.0, 2, 2, 1),
        rotate_bytes=0,
        set_memory=1 << 20,
        tolerance=1e-2,
        mode="auto",
        seed=0,
    )
    return row, ctx, env


def test_agreeing_implementations_are_timed() -> None:
    res = bench_row(*_fake_row(2.0))
    assert res.status == "ok" and res.check is not None and res.check.ok
    assert res.check.rel_err == {"y": 0.0}
    assert res.clef.stats is not None and res.fla.stats is not None
    assert len(res.clef.stats.samples) == 2 and res.rotation == 2


def test_a_disagreeing_kernel_gets_no_number() -> None:
    res = bench_row(*_fake_row(2.5))
    assert res.status == "mismatch" and res.failed
    assert res.check is not None and res.check.rel_err["y"] == pytest.approx(0.2)
    assert res.clef.stats is None and res.fla.stats is None
    assert any("disagree" in n for n in res.notes)


def test_peers_are_checked_against_fla_and_timed_or_dropped() -> None:
    res = bench_row(*_fake_row(2.0, peers={"flashqla": 2.0, "clef-split": 2.0}))
    assert res.status == "ok" and not res.failed
    assert all(res.peers[n].stats is not None for n in ("flashqla", "clef-split"))
    assert res.ratio_to_clef(res.peers["flashqla"]) is not None
    assert res.check is not None and res.check.peer_rel_err["flashqla"] == {"y": 0.0}
    # a peer that disagrees is not timed; clef's own split design failing fails the run
    res = bench_row(*_fake_row(2.0, peers={"flashqla": 2.5}))
    assert res.status == "ok" and not res.failed and res.peers["flashqla"].stats is None
    assert any("flashqla n/a" in n and "disagrees" in n for n in res.notes)
    res = bench_row(*_fake_row(2.0, peers={"clef-split": 3.0}))
    assert res.status == "ok" and res.failed and res.peers["clef-split"].stats is None
    lines = table_lines([res], 1e9)
    assert "clef-split" in lines[0] and "clef-split/clef" in lines[0]


def test_idle_mode_timessingle_calls_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """--mode idle times one call a sample (each from an idle GPU on CUDA), the calls taking the
    rotation sets in turn; eager times a round over every set."""
    seen: list[int] = []
    go = single_calls(
        lambda s: seen.append(int(s["i"])) or s, [{"i": torch.tensor(0)}, {"i": torch.tensor(1)}]
    )
    for _ in range(3):
        go()
    assert seen == [0, 1, 0]
    timed: list[list[int]] = []

    def recording(rounds: object, calls: list[int], *args: object, **kw: object) -> object:
        timed.append(list(calls))
        return time_rounds(rounds, calls, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(measure, "time_rounds", recording)
    for mode, calls in (("idle", [1, 1]), ("eager", [2, 2])):
        row, ctx, env = _fake_row(2.0)
        res = bench_row(row, ctx, dataclasses.replace(env, mode=mode))
        assert res.status == "ok" and res.clef.stats is not None and len(res.clef.stats.samples) == 2
        assert timed.pop() == calls


def test_a_non_finite_output_gets_no_number() -> None:
    res = bench_row(*_fake_row(2.0, clef_nan=True))
    assert res.status == "invalid" and res.clef.stats is None
    assert any("non-finite" in n for n in res.notes)


# ---- the command ----------------------------------------------------------------------------------


def test_cpu_without_allow_cpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench_command(parse("--device", "cpu")) == 2
    err = capsys.readouterr().err
    assert err.strip() == CPU_REFUSAL
    assert "--allow-cpu" in err


def test_cpu_refusal_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from clef_runtime.cli import main

    assert main(["bench", "--device", "cpu", "--rows", "l2norm"]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


def test_unknown_row_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench_command(parse("--rows", "chunk,bogus", "--device", "cpu", "--allow-cpu")) == 2
    assert "bogus matches no row" in capsys.readouterr().err


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench_command(parse("--list")) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == [r.name for r in ROWS]


def test_cheap_row_end_to_end(tmp_path: Path) -> None:
    """`clef-runtime bench --allow-cpu` in a process of its own under the Triton interpreter (which
    must be chosen before triton is imported), so that it runs on a GPU host too."""
    out = tmp_path / "bench.json"
    argv = [
        "--device",
        "cpu",
        "--allow-cpu",
        "--quick",
        "--no-fla",
        "--rows",
        "gdn_gating",
        "--json",
        str(out),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "bench", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.splitlines()
    assert table[-2].split()[0] == "row" and table[-1].split()[0] == "gdn_gating_t8192"
    doc = json.loads(out.read_text())
    assert doc["schema"] == "clef-bench/1" and doc["tiny_shapes"] is True and doc["dtype"] == "bf16"
    assert doc["complete"] is True
    assert doc["copy"]["bytes_per_s"] > 0 and doc["versions"]["torch"] == torch.__version__
    (row,) = doc["rows"]
    assert row["name"] == "gdn_gating_t8192" and row["status"] == "ok" and row["check"]["ok"]
    # the tiny gating row, T = 16 tokens, HV = 4 heads, bf16 in, float32 out: a, b 16 * 4 * 2 = 128
    # each; A_log, dt_bias 4 * 4 = 16 each; g, beta 16 * 4 * 4 = 256 each
    assert row["bytes"] == 128 + 128 + 16 + 16 + 256 + 256 == 800
    assert row["clef"]["samples"] == 2 and row["clef"]["median_s"] > 0
    assert row["fla"] == {"na": "not loaded (--no-fla)"}
    assert doc["targets"] is None  # tiny shapes: no targets (tests/runtime/test_bench_targets.py)


@pytest.mark.gpu
def test_cuda_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CUDA paths (events, graph capture, rotation, the copy ceiling) on a few cheap rows, with
    FLA when it is importable: every row checked and timed."""
    out = tmp_path / "bench.json"
    rows = "recurrent_b1,gdn_gating,l2norm,layer_core"
    rc = run_bench_command(parse("--quick", "--seconds", "0.05", "--rows", rows, "--json", str(out)))
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    doc = json.loads(out.read_text())
    assert doc["device"]["type"] == "cuda" and doc["copy"]["bytes_per_s"] > 1e11
    by_name = {r["name"]: r for r in doc["rows"]}
    assert set(by_name) == {"recurrent_b1", "gdn_gating_t8192", "l2norm_t8192", "layer_core_decode_b1_graph"}
    for r in by_name.values():
        assert r["status"] == "ok" and r["check"]["ok"], r
        assert r["clef"]["median_s"] > 0 and r["rotation_sets"] >= 8
    assert by_name["recurrent_b1"]["mode"] == "graph"
    assert by_name["layer_core_decode_b1_graph"]["mode"] == "graph"


@pytest.mark.gpu
def test_cuda_idle_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--mode idle on CUDA: every call alone from an idle GPU, its host enqueue time recorded; a
    lone small call then costs at least what the host takes to launch it."""
    out = tmp_path / "bench.json"
    argv = ("--quick", "--seconds", "0.05", "--rows", "gdn_gating", "--mode", "idle", "--json", str(out))
    rc = run_bench_command(parse(*argv))
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "ok" and row["mode"] == "idle"
    clef = row["clef"]
    assert clef["samples"] >= 5 and clef["host_enqueue_s"] > 0
    assert "host µs/call" in captured.out


@pytest.mark.gpu
def test_host_sync_names_a_call_that_syncs() -> None:
    """`host_sync` finds a round that synchronises with the host (as FLA's and FlashQLA's packed
    calls do: the bench then times the row eagerly instead of capturing a graph that would fail)
    and passes one that only launches work; the sync debug mode is restored either way."""
    from clef_runtime.bench.timing import host_sync

    x = torch.ones(1024, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    assert host_sync(lambda: float(x.sum())) is not None
    assert host_sync(lambda: x.mul_(1.0)) is None
    assert torch.cuda.get_sync_debug_mode() == before
