"""The chunked prefill's speed targets against FlashQLA, judged per row of a finished run.

DESIGN.md ("Performance targets") and issue 36 set them as ratios FlashQLA time / clef time
(medians, one process, order rotated): ≥ 1.3× at B1 T32768 under a CUDA graph, ≥ 1.15× on every
other chunk row in every mode, and ≥ 1.0× on every row when q and k arrive normalised
(``--no-qk-l2norm``).  The bench prints one verdict per chunk row under its table, and ``--json``
keeps them, so a run says by itself which targets it met.  A row without a FlashQLA time (not
installed, or its check failed) is judged "n/a", never met.  The targets are for bf16 at the model's
shapes: a run in another dtype or on the CPU's tiny shapes is not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clef_runtime.bench.report import RowResult

PEER = "flashqla"
LONG_ROW = "chunk_b1_t32768"
LONG_GRAPH_TARGET = 1.3
ROW_TARGET = 1.15
NO_NORM_TARGET = 1.0


@dataclass(frozen=True)
class Verdict:
    """One chunk row's ratio against its target (``ratio`` None: FlashQLA was not timed)."""

    row: str
    mode: str
    ratio: float | None
    target: float

    @property
    def met(self) -> bool:
        return self.ratio is not None and self.ratio >= self.target

    def line(self) -> str:
        if self.ratio is None:
            outcome, got = "n/a", "no FlashQLA time"
        else:
            outcome, got = ("met" if self.met else "MISSED"), f"{self.ratio:.2f}x"
        return f"target {self.row} ({self.mode}): FlashQLA/clef {got}, needs >= {self.target:.2f}x: {outcome}"

    def record(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "mode": self.mode,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        }


def chunk_target(row: str, mode: str, qk_l2norm: bool) -> float | None:
    """The ratio row `row` must reach in `mode` (None: not a chunk row, no target here)."""
    if not row.startswith("chunk_"):
        return None
    if not qk_l2norm:
        return NO_NORM_TARGET
    if row == LONG_ROW and mode.startswith("graph"):
        return LONG_GRAPH_TARGET
    return ROW_TARGET


def judged(dtype: str, tiny: bool) -> bool:
    """Whether a run in `dtype` (bench name, e.g. "bf16") on tiny shapes or not has targets."""
    return dtype == "bf16" and not tiny


def verdicts(rows: Sequence[RowResult], qk_l2norm: bool) -> list[Verdict]:
    """A verdict for every chunk row of the run, in the table's order (a run `judged` allows)."""
    out = []
    for r in rows:
        target = chunk_target(r.name, r.mode, qk_l2norm)
        if target is None:
            continue
        peer = r.peers.get(PEER)
        ratio = r.ratio_to_clef(peer) if peer is not None else None
        out.append(Verdict(r.name, r.mode, ratio, target))
    return out


def summary_lines(found: Sequence[Verdict]) -> list[str]:
    """The verdicts, then how many were met (nothing when the run had no chunk row)."""
    if not found:
        return []
    met = sum(v.met for v in found)
    return [*(v.line() for v in found), f"targets: {met} of {len(found)} chunk rows met"]
