"""Benchmark results: the per-row record, the aligned table printed last, and the JSON document
written by ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clef_runtime.bench.floors import Floor
from clef_runtime.bench.timing import Stats, paired_ratios

SCHEMA = "clef-bench/1"


@dataclass
class ImplResult:
    """One implementation's outcome in a row: stats, or why it has none (``na``)."""

    name: str
    stats: Stats | None = None
    na: str | None = None


@dataclass
class Check:
    """The pre-timing check: clef's outputs against FLA's (relative L2 error per output)."""

    tolerance: float
    rel_err: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    against: str = "fla"  # or "sanity" when there is no FLA to compare with
    peer_rel_err: dict[str, dict[str, float]] = field(default_factory=dict)  # against FLA, else clef

    @property
    def worst(self) -> float | None:
        return max(self.rel_err.values()) if self.rel_err else None

    @property
    def ok(self) -> bool:
        return not self.problems and all(e <= self.tolerance for e in self.rel_err.values())

    def record(self) -> dict[str, Any]:
        return {
            "against": self.against,
            "tolerance": self.tolerance,
            "rel_err": self.rel_err,
            "problems": self.problems,
            "ok": self.ok,
            "peer_rel_err": self.peer_rel_err,
        }


@dataclass
class RowResult:
    name: str
    op: str
    case: str
    floor: Floor
    show_tflops: bool = False
    status: str = "ok"  # ok | mismatch | invalid | error
    # eager (back to back) | idle (each call from an idle GPU) | graph | graph* (switched: eager
    # was host-bound) | host (CPU)
    mode: str = "-"
    rotation: int = 0
    set_bytes: int = 0
    seconds: float = 0.0
    check: Check | None = None
    clef: ImplResult = field(default_factory=lambda: ImplResult("clef"))
    fla: ImplResult = field(default_factory=lambda: ImplResult("fla"))
    notes: list[str] = field(default_factory=list)
    # implementations beside clef and FLA (FlashQLA, clef's split design), by name
    peers: dict[str, ImplResult] = field(default_factory=dict)
    # a clef implementation among the peers failed its check (the run's exit code says so)
    peer_failed: bool = False

    @property
    def failed(self) -> bool:
        return self.status != "ok" or self.peer_failed

    def impl(self, name: str) -> ImplResult:
        if name == "clef":
            return self.clef
        if name == "fla":
            return self.fla
        return self.peers.setdefault(name, ImplResult(name))

    def ratio_to_clef(self, impl: ImplResult) -> float | None:
        """``impl``'s time / clef's time (above 1: clef is faster)."""
        if self.clef.stats is None or impl.stats is None:
            return None
        return impl.stats.median / self.clef.stats.median

    def paired_to_clef(self, impl: ImplResult) -> Stats | None:
        """``impl``'s time / clef's, pair by pair of interleaved samples (`paired_ratios`)."""
        if self.clef.stats is None or impl.stats is None:
            return None
        return paired_ratios(self.clef.stats, impl.stats)

    def floor_s(self, copy_bw: float) -> float:
        return self.floor.bytes / copy_bw

    def share(self, impl: ImplResult, copy_bw: float) -> float | None:
        """Share of the measured copy bandwidth: floor bytes / time / copy BW."""
        if impl.stats is None:
            return None
        return self.floor.bytes / impl.stats.median / copy_bw

    def tflops(self, impl: ImplResult) -> float | None:
        if impl.stats is None or self.floor.flops is None:
            return None
        return self.floor.flops / impl.stats.median / 1e12

    @property
    def ratio(self) -> float | None:
        """FLA time / clef time (above 1: clef is faster)."""
        if self.clef.stats is None or self.fla.stats is None:
            return None
        return self.fla.stats.median / self.clef.stats.median

    def record(self, copy_bw: float) -> dict[str, Any]:
        def impl(i: ImplResult) -> dict[str, Any]:
            out: dict[str, Any] = {"na": i.na} if i.stats is None else i.stats.record()
            if i.stats is not None:
                out["bw_share"] = self.share(i, copy_bw)
                out["tflops"] = self.tflops(i)
            paired = None if i is self.clef else self.paired_to_clef(i)
            if paired is not None:  # this implementation's time / clef's, pair by pair
                out["paired_ratio_over_clef"] = {
                    "median": paired.median,
                    "p10": paired.p10,
                    "p90": paired.p90,
                }
            return out

        return {
            "name": self.name,
            "op": self.op,
            "case": self.case,
            "status": self.status,
            "mode": self.mode,
            "rotation_sets": self.rotation,
            "set_bytes": self.set_bytes,
            "bytes": self.floor.bytes,
            "bytes_terms": dict(self.floor.terms),
            "flops": self.floor.flops,
            "floor_s": self.floor_s(copy_bw),
            "check": None if self.check is None else self.check.record(),
            "clef": impl(self.clef),
            "fla": impl(self.fla),
            "ratio_fla_over_clef": self.ratio,
            "peers": {
                name: {**impl(p), "ratio_over_clef": self.ratio_to_clef(p)} for name, p in self.peers.items()
            },
            "wall_s": self.seconds,
            "notes": self.notes,
        }


# ---- formatting -------------------------------------------------------------------------------------


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-5:
        return f"{s * 1e6:.2f} µs"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.3f} ms"
    return f"{s:.3f} s"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _impl_cell(row: RowResult, impl: ImplResult) -> str:
    if row.status in ("mismatch", "invalid"):
        return row.status.upper()
    if row.status == "error" and impl is row.clef:
        return "ERROR"
    if impl.stats is None:
        return "n/a"
    return f"{fmt_time(impl.stats.median)} ±{100 * impl.stats.spread:.1f}%"


def _ratio_cell(r: float | None, paired: Stats | None = None) -> str:
    """The ratio of medians, and where the samples were paired the p10-p90 of the pair-by-pair
    ratios (`paired_ratios`): "1.02x (0.99-1.05)"."""
    if r is None:
        return "-"
    if paired is None:
        return f"{r:.2f}x"
    return f"{r:.2f}x ({paired.p10:.2f}-{paired.p90:.2f})"


def _host_cell(row: RowResult, impls: Sequence[ImplResult | None]) -> str:
    """The host's enqueue time per call of each of `impls` ("162.0 / 297.3"), for rows launched
    eagerly (back to back or from idle); "-" for one without a time, blank for other modes."""
    if row.mode not in ("eager", "idle"):
        return ""
    cells = []
    for i in impls:
        h = None if i is None or i.stats is None else i.stats.host_median
        cells.append("-" if h is None else f"{h * 1e6:.1f}")
    return " / ".join(cells)


def _tflops_cell(row: RowResult, impl: ImplResult) -> str:
    if not row.show_tflops:
        return ""
    t = row.tflops(impl)
    return "-" if t is None else f"{t:.1f}"


HEADER = (
    "row",
    "case",
    "mode",
    "floor",
    "clef",
    "FLA",
    "FLA/clef",
    "clef BW",
    "FLA BW",
    "clef TF/s",
    "FLA TF/s",
    "host µs/call",
    "notes",
)
RIGHT = {"floor", "clef", "FLA", "FLA/clef", "clef BW", "FLA BW", "clef TF/s", "FLA TF/s", "host µs/call"}


def number_notes(rows: Sequence[RowResult]) -> tuple[list[str], dict[str, list[int]]]:
    """Footnotes shared across rows: (texts in order, row name -> footnote numbers)."""
    texts: list[str] = []
    per_row: dict[str, list[int]] = {}
    for row in rows:
        nums = []
        for text in row.notes:
            if text not in texts:
                texts.append(text)
            nums.append(texts.index(text) + 1)
        per_row[row.name] = nums
    return texts, per_row


def table_lines(
    rows: Sequence[RowResult], copy_bw: float, notes: dict[str, list[int]] | None = None
) -> list[str]:
    """The aligned table: one line per row; times are medians with the (p90 - p10)/median spread;
    ratios are of the medians, with the p10-p90 of the pair-by-pair ratios where the samples
    were interleaved in pairs (`paired_ratios`); BW is the share of the measured copy bandwidth
    at the byte floor; host µs/call the enqueue time of clef, FLA and each peer.  Peers
    (FlashQLA, clef's split design) get a time and a ratio column each, when any row has them."""
    peer_names: list[str] = []
    for r in rows:
        peer_names += [n for n in r.peers if n not in peer_names]
    header = (*HEADER[:-1], *(c for n in peer_names for c in (n, f"{n}/clef")), HEADER[-1])
    right = RIGHT | {c for n in peer_names for c in (n, f"{n}/clef")}
    body: list[tuple[str, ...]] = []
    for r in rows:
        nums = (notes or {}).get(r.name, [])
        peer_cells: list[str] = []
        for n in peer_names:
            p = r.peers.get(n)
            if p is None:
                peer_cells += ["", ""]
            else:
                peer_cells += [_impl_cell(r, p), _ratio_cell(r.ratio_to_clef(p), r.paired_to_clef(p))]
        body.append(
            (
                r.name,
                r.case,
                r.mode,
                fmt_time(r.floor_s(copy_bw)),
                _impl_cell(r, r.clef),
                _impl_cell(r, r.fla),
                _ratio_cell(r.ratio, r.paired_to_clef(r.fla)),
                fmt_pct(r.share(r.clef, copy_bw)),
                fmt_pct(r.share(r.fla, copy_bw)),
                _tflops_cell(r, r.clef),
                _tflops_cell(r, r.fla),
                _host_cell(r, [r.clef, r.fla, *(r.peers.get(n) for n in peer_names)]),
                *peer_cells,
                ",".join(str(n) for n in nums),
            )
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(cells, widths, header, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [line(header), *(line(b) for b in body)]


def row_note_texts(row: RowResult) -> list[str]:
    """The notes a row adds to the footnotes: FLA's n/a reason, the check's outcome, its own."""
    out = []
    if row.status in ("mismatch", "invalid", "error") and row.check is not None and row.check.problems:
        out.extend(row.check.problems)
    elif row.status == "mismatch" and row.check is not None:
        out.append(
            f"clef and FLA disagree: worst relative error {row.check.worst:.3g} > {row.check.tolerance:g}; "
            "neither is timed"
        )
    if row.clef.stats is None and row.clef.na:
        out.append(f"clef: {row.clef.na}")
    if row.fla.stats is None and row.fla.na:
        out.append(f"FLA n/a: {row.fla.na}")
    for name, p in row.peers.items():
        if p.stats is None and p.na:
            out.append(f"{name} n/a: {p.na}")
    return out
