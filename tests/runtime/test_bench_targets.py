"""The bench's verdicts on the chunked prefill's targets against FlashQLA (`clef_runtime.bench.targets`)."""

from __future__ import annotations

import pytest

from clef_runtime.bench.floors import Dims, chunk_floor
from clef_runtime.bench.report import ImplResult, RowResult
from clef_runtime.bench.rows import select_rows
from clef_runtime.bench.targets import Verdict, chunk_target, judged, summary_lines, verdicts
from clef_runtime.bench.timing import Stats

SMALL = Dims(H=2, HV=4, K=8, V=16, W=4, hidden=32)
CHUNK_ROWS = (
    "chunk_b1_t32768",
    "chunk_b1_t8192",
    "chunk_b4_t8192",
    "chunk_b1_t2048_graph",
    "chunk_b1_t131072",
    "chunk_packed_8x4096",
    "chunk_b1_t512_graph",
)
MODES = ("graph", "graph*", "eager", "idle")


def test_the_issue_rows_are_the_bench_chunk_rows() -> None:
    """The seven rows the targets name are exactly the bench's chunk rows (a new chunk row needs
    its case here)."""
    assert tuple(r.name for r in select_rows(["chunk"])[0]) == CHUNK_ROWS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("row", CHUNK_ROWS)
@pytest.mark.parametrize("norm", [True, False])
def test_every_chunk_row_has_its_target(row: str, mode: str, norm: bool) -> None:
    """1.3x at B1 T32768 under a graph, 1.15x on every other row and mode, 1.0x on every row when
    q and k arrive normalised."""
    if not norm:
        want = 1.0
    elif row == "chunk_b1_t32768" and mode.startswith("graph"):
        want = 1.3
    else:
        want = 1.15
    assert chunk_target(row, mode, norm) == want


@pytest.mark.parametrize(
    "row", ["recurrent_b128", "conv_update_b256", "layer_decode_b1_graph", "l2norm_t8192"]
)
def test_other_rows_have_no_target_here(row: str) -> None:
    assert chunk_target(row, "graph", True) is None and chunk_target(row, "eager", False) is None


def row(name: str, mode: str, clef_s: float | None, peer_s: float | None) -> RowResult:
    r = RowResult(name, "chunk_gated_delta_rule", "B1 T8", chunk_floor(SMALL, 1, 8, 2), mode=mode)
    if clef_s is not None:
        r.clef = ImplResult("clef", Stats((clef_s * 0.99, clef_s, clef_s * 1.01)))
    if peer_s is not None:
        r.peers["flashqla"] = ImplResult("flashqla", Stats((peer_s,)))
    return r


def test_verdicts_judge_each_chunk_row_by_the_ratio_of_medians() -> None:
    rows = [
        row("chunk_b1_t32768", "graph", 690e-6, 875e-6),  # 1.268x < 1.3x
        row("chunk_b4_t8192", "graph", 669e-6, 839e-6),  # 1.254x >= 1.15x
        row("recurrent_b128", "graph", 1e-4, None),  # no target: left out
        row("chunk_b1_t512_graph", "eager", 38e-6, 38e-6 * 1.1501),  # just above the target: met
        row("chunk_packed_8x4096", "graph", 700e-6, None),  # FlashQLA not timed
    ]
    found = verdicts(rows, qk_l2norm=True)
    assert [(v.row, v.target, v.met) for v in found] == [
        ("chunk_b1_t32768", 1.3, False),
        ("chunk_b4_t8192", 1.15, True),
        ("chunk_b1_t512_graph", 1.15, True),
        ("chunk_packed_8x4096", 1.15, False),
    ]
    assert found[0].ratio == pytest.approx(875 / 690)
    assert found[3].ratio is None
    lines = summary_lines(found)
    assert lines == [
        "target chunk_b1_t32768 (graph): FlashQLA/clef 1.27x, needs >= 1.30x: MISSED",
        "target chunk_b4_t8192 (graph): FlashQLA/clef 1.25x, needs >= 1.15x: met",
        "target chunk_b1_t512_graph (eager): FlashQLA/clef 1.15x, needs >= 1.15x: met",
        "target chunk_packed_8x4096 (graph): FlashQLA/clef no FlashQLA time, needs >= 1.15x: n/a",
        "targets: 2 of 4 chunk rows met",
    ]


def test_without_the_norm_every_chunk_row_needs_parity() -> None:
    found = verdicts([row("chunk_packed_8x4096", "graph", 662.4e-6, 659.6e-6)], qk_l2norm=False)
    assert [(v.target, v.met) for v in found] == [(1.0, False)]
    assert found[0].line().endswith("FlashQLA/clef 1.00x, needs >= 1.00x: MISSED")


def test_a_row_clef_could_not_time_is_not_met() -> None:
    (v,) = verdicts([row("chunk_b1_t8192", "graph", None, 3e-4)], qk_l2norm=True)
    assert v.ratio is None and not v.met
    assert v.record() == {
        "row": "chunk_b1_t8192",
        "mode": "graph",
        "ratio": None,
        "target": 1.15,
        "met": False,
    }


def test_no_chunk_rows_print_nothing() -> None:
    assert summary_lines(verdicts([row("recurrent_b1", "graph", 1e-6, None)], qk_l2norm=True)) == []
    assert summary_lines([]) == []
    assert Verdict("chunk_x", "graph", 2.0, 1.15).met


def test_only_bf16_at_the_model_shapes_is_judged() -> None:
    assert judged("bf16", tiny=False)
    assert not judged("bf16", tiny=True) and not judged("f16", tiny=False) and not judged("f32", tiny=False)
