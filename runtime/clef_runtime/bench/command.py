"""``clef-runtime bench``: argument parsing and the run (docs/performance.md has the method).

The run measures the copy bandwidth the shares are computed against, loads clef's ops and the
peers, benchmarks each row (`clef_runtime.bench.measure`) and writes the table and the JSON.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_contract.command import FAULT_ENV
from clef_runtime.bench.floors import QWEN35_9B, TINY
from clef_runtime.bench.measure import Env, bench_row, crashed_row, device_usable
from clef_runtime.bench.provenance import device_info, fla_backend, fla_env, versions
from clef_runtime.bench.report import SCHEMA, RowResult, number_notes, table_lines
from clef_runtime.bench.rows import ROWS, Context, Row, select_rows
from clef_runtime.bench.targets import Verdict, judged, summary_lines, verdicts
from clef_runtime.bench.timing import Budget, CopyBandwidth, measure_copy_bandwidth
from clef_runtime.dtypes import NAMES, torch_dtype
from clef_runtime.interpreter import interpreting

if TYPE_CHECKING:
    from clef_runtime.opset import OpSet

# clef vs FLA, relative L2 error per output: loose, a wrong kernel is off by O(1)
TOLERANCE = {"bf16": 5e-2, "f16": 2e-2, "f32": 1e-2}
FALLBACK_L2 = 50 * 2**20

CPU_REFUSAL = (
    "bench: --device cpu would time the Triton interpreter, which says nothing about kernel speed. "
    "Run on a CUDA GPU, or pass --allow-cpu to exercise the code path on tiny shapes "
    "(TRITON_INTERPRET=1)."
)


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``bench`` on the CLI's subparsers."""
    names = ", ".join(r.name for r in ROWS)
    p = sub.add_parser(
        "bench",
        help="time clef's GDN kernels against flash-linear-attention at Qwen3.5-9B shapes",
        description=(
            "Times each row (medians of many CUDA-event samples over rotated random inputs, "
            "after a correctness check of clef against FLA), with the share of the copy bandwidth "
            "measured in the same run.  Prints an aligned table, then for the chunk rows a verdict "
            "on each one's target against FlashQLA; --json writes everything."
        ),
        epilog=f"rows: {names}",
    )
    p.add_argument(
        "--rows",
        help="comma-separated row names, globs (e.g. 'recurrent_*'), prefixes (chunk, recurrent, conv, "
        "layer, ...) or op names; default: every row",
    )
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--quick", action="store_true", help="fewer samples and warm-up rounds")
    p.add_argument("--no-fla", action="store_true", help="do not import flash-linear-attention")
    p.add_argument(
        "--no-flashqla",
        action="store_true",
        help="do not import FlashQLA (flash-qla), the chunk rows' second peer",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="also time clef's split chunk design (not the default path) in the chunk rows",
    )
    p.add_argument(
        "--no-qk-l2norm",
        action="store_true",
        help="chunk rows: q and k arrive L2-normalised and every implementation runs without "
        "in-kernel normalisation (default: normalised inside the op, as the model calls it)",
    )
    p.add_argument("--json", metavar="PATH", help="write the full results (JSON) here")
    p.add_argument("--dtype", choices=sorted(NAMES), default="bf16", help="activation dtype (default bf16)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu with --allow-cpu")
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="on --device cpu, run tiny shapes under the Triton interpreter (exercises the code path only)",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "eager", "graph", "idle"),
        default="auto",
        help="auto (default): graph rows and decode rows replay a CUDA graph, the others launch "
        "eagerly unless that turns out host-bound; eager/graph: force one for every row (eager: "
        "calls back to back); idle: every call alone from an idle GPU (a sync, events around one "
        "call: the GPU's wait on the host included)",
    )
    p.add_argument("--seconds", type=float, help="sampling time per row (default 1.0; --quick 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    return p


@dataclass(frozen=True)
class Options:
    rows: list[str] | None
    list_rows: bool
    quick: bool
    no_fla: bool
    json: str | None
    no_flashqla: bool
    split: bool
    no_qk_l2norm: bool
    dtype: str
    device: str
    allow_cpu: bool
    mode: str
    seconds: float | None
    seed: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        rows = None
        if args.rows:
            rows = [p.strip() for p in str(args.rows).split(",") if p.strip()]
        return cls(
            rows=rows,
            list_rows=bool(args.list),
            quick=bool(args.quick),
            no_fla=bool(args.no_fla),
            json=args.json,
            no_flashqla=bool(getattr(args, "no_flashqla", False)),
            split=bool(getattr(args, "split", False)),
            no_qk_l2norm=bool(getattr(args, "no_qk_l2norm", False)),
            dtype=str(args.dtype),
            device=str(args.device),
            allow_cpu=bool(args.allow_cpu),
            mode=str(args.mode),
            seconds=args.seconds,
            seed=int(args.seed),
        )


def _err(msg: str) -> int:
    print(msg, file=sys.stderr)
    return 2


def _prepare_device(opts: Options) -> torch.device | str:
    """The device, or the message of why the bench cannot run (exit 2)."""
    try:
        device = torch.device(opts.device)
    except (RuntimeError, ValueError) as e:
        return f"bench: --device {opts.device!r} is not a device ({e}): use cuda, cuda:N or cpu"
    if device.type == "cpu":
        if not opts.allow_cpu:
            return CPU_REFUSAL
        # Triton chooses interpreter or compiler when a kernel is decorated, i.e. at import.
        if "triton" not in sys.modules:
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if not interpreting():
            return (
                "bench: --allow-cpu needs the Triton interpreter, but TRITON_INTERPRET is not set and "
                "triton was already imported: run with TRITON_INTERPRET=1"
            )
        return device
    if device.type != "cuda":
        return f"bench: device type {device.type!r} is not supported: use cuda or cpu"
    if not torch.cuda.is_available():
        return "bench: no CUDA device is visible (torch.cuda.is_available() is False); nothing to time"
    if interpreting():
        return "bench: TRITON_INTERPRET is set, so the kernels would be interpreted, not compiled: unset it"
    if device.index is None:  # set_device, Generator and friends want an index
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
        return f"bench: {device} does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
    return device


def _budget(opts: Options, tiny: bool) -> Budget:
    if tiny:
        return Budget(seconds=0.0, min_samples=2, max_samples=2, warmup_rounds=1)
    if opts.quick:
        return Budget(seconds=opts.seconds if opts.seconds is not None else 0.2, min_samples=5,
                      max_samples=50, warmup_rounds=1)  # fmt: skip
    return Budget(seconds=opts.seconds if opts.seconds is not None else 1.0, min_samples=20,
                  max_samples=500, warmup_rounds=3)  # fmt: skip


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench_command(args: argparse.Namespace) -> int:
    """Run ``clef-runtime bench``; returns the exit code: 0 measured, 1 a check failed or clef
    errored on some row, 2 could not run."""
    opts = Options.from_args(args)
    if opts.list_rows:
        _print_rows()
        return 0
    rows, unmatched = select_rows(opts.rows)
    if unmatched:
        return _err(
            f"bench: --rows {', '.join(unmatched)} matches no row; rows are: {', '.join(r.name for r in ROWS)}"
        )
    device = _prepare_device(opts)
    if isinstance(device, str):
        return _err(device)
    ops = _load_ops(device)
    if isinstance(ops, str):
        return _err(ops)
    peers = _load_peers(opts)
    info = device_info(device)
    env = _make_env(opts, device, info)
    fault = os.environ.get(FAULT_ENV)
    if fault:
        _progress(f"bench: {FAULT_ENV}={fault} is set: clef's kernels carry that fault")
    started = _dt.datetime.now(_dt.UTC)
    with torch.no_grad():
        copy = _copy_bandwidth(device, opts.quick)
        ctx = _context(opts, env, ops, peers)
        base_record = _base_record(opts, env, info, peers, started, fault)
        results = _run_rows(rows, ctx, env, opts, base_record, copy)
    _report(opts, info, peers, env, copy, base_record, results)
    return 1 if any(r.failed for r in results) else 0


def _print_rows() -> None:
    """``--list``: every row, its op, its full shape and how it is timed."""
    for r in ROWS:
        graph = "graph" if r.graph else "auto"
        print(f"{r.name:28s} {r.op:34s} B{r.full[0]} T{r.full[1]}  {graph}")


def _load_ops(device: torch.device) -> OpSet | str:
    """clef's Triton op set for the dims the rows will use (tiny on the CPU: the key-band fault
    needs their conv bands); a message saying why when it cannot be imported."""
    try:
        from clef_runtime.opset import get_opset

        return get_opset("triton", qkv_split=(TINY if device.type == "cpu" else QWEN35_9B).qkv_split)
    except Exception as e:
        return f"bench: clef's Triton ops cannot be imported ({type(e).__name__}: {e})"


def _copy_bandwidth(device: torch.device, quick: bool) -> CopyBandwidth:
    """The copy bandwidth the shares are computed against, measured now (a small copy on the CPU)."""
    copy = (
        measure_copy_bandwidth(device, 1 << 30, 10 if quick else 30)
        if device.type == "cuda"
        else measure_copy_bandwidth(device, 8 << 20, 3)
    )
    _progress(f"bench: copy bandwidth {copy.bytes_per_s / 1e9:.0f} GB/s (read + written)")
    return copy


def _context(opts: Options, env: Env, ops: OpSet, peers: Peers) -> Context:
    """What every row runs with: the device, dtype and dims, clef's ops and the peers'."""
    return Context(
        device=env.device,
        dtype=torch_dtype(opts.dtype),
        dims=env.dims,
        ops=ops,
        fla=peers.fla,
        fla_reason=peers.fla_reason,
        flashqla=peers.flashqla,
        flashqla_reason=peers.flashqla_reason,
        split=opts.split,
        qk_l2norm=not opts.no_qk_l2norm,
        fla_backend=fla_backend(peers.flashqla is not None),
    )


def _report(
    opts: Options,
    info: dict[str, Any],
    peers: Peers,
    env: Env,
    copy: CopyBandwidth,
    base_record: dict[str, Any],
    results: list[RowResult],
) -> None:
    """The finished run: the JSON (with --json) marked complete, then the header, the numbered
    notes and the table on stdout."""
    header = _header(info, opts, peers.fla_version, copy, env.tiny, peers.flashqla_version)
    texts, per_row = number_notes(results)
    lines = [
        *header,
        *(f"[{i}] {t}" for i, t in enumerate(texts, 1)),
        "",
        *table_lines(results, copy.bytes_per_s, per_row),
    ]
    found = run_verdicts(base_record, results)
    if found:
        lines += ["", *summary_lines(found)]
    if opts.json:
        write_json(Path(opts.json), base_record, results, copy, complete=True)
        _progress(f"bench: wrote {opts.json}")
    print("\n".join(lines), flush=True)


@dataclass(frozen=True)
class Peers:
    """The peers' modules (None: not there, and why) and versions."""

    fla: Any
    fla_version: str | None
    fla_reason: str
    flashqla: Any
    flashqla_version: str | None
    flashqla_reason: str


def _load_peers(opts: Options) -> Peers:
    """FlashQLA first (FLA reads the dispatch switch at its import: FLA's column stays FLA's Triton
    kernels, FlashQLA gets its own), then FLA; each missing one says why on stderr."""
    flashqla, flashqla_version = None, None
    flashqla_reason = "not loaded (--no-flashqla)"
    if not opts.no_flashqla:
        from clef_runtime.bench.fla_peer import DISPATCH_ENV, load_flashqla

        os.environ.setdefault(DISPATCH_ENV, "1")
        flashqla, msg = load_flashqla()
        flashqla_version, flashqla_reason = (msg, "") if flashqla is not None else (None, msg)
        if flashqla is None:
            _progress(f"bench: {msg}; FlashQLA columns will read n/a")
    fla, fla_version = None, None
    fla_reason = "not loaded (--no-fla)"
    if not opts.no_fla:
        from clef_runtime.bench.fla_peer import load_fla

        fla, msg = load_fla()
        fla_version, fla_reason = (msg, "") if fla is not None else (None, msg)
        if fla is None:
            _progress(f"bench: {msg}; FLA columns will read n/a")
    return Peers(fla, fla_version, fla_reason, flashqla, flashqla_version, flashqla_reason)


def _make_env(opts: Options, device: torch.device, info: dict[str, Any]) -> Env:
    """Shapes, sampling budget and rotation sizes for this device (tiny shapes on the CPU)."""
    tiny = device.type == "cpu"
    l2 = info.get("l2_bytes") or FALLBACK_L2
    if device.type == "cuda":
        torch.cuda.set_device(device)
        free, _total = torch.cuda.mem_get_info(device)
        set_memory = free // 4
    else:
        set_memory = 1 << 30
    return Env(
        device=device,
        tiny=tiny,
        dims=TINY if tiny else QWEN35_9B,
        budget=_budget(opts, tiny),
        rotate_bytes=3 * int(l2),
        set_memory=int(set_memory),
        tolerance=TOLERANCE[opts.dtype],
        mode=opts.mode,
        seed=opts.seed,
    )


def _base_record(
    opts: Options, env: Env, info: dict[str, Any], peers: Peers, started: _dt.datetime, fault: str | None
) -> dict[str, Any]:
    """What the JSON says about the whole run (the rows are added as they finish)."""
    return {
        "schema": SCHEMA,
        "date": started.isoformat(timespec="seconds"),
        "device": info,
        "versions": {**versions(peers.fla_version), "flash_qla": peers.flashqla_version},
        "fla_env": fla_env(),
        "dtype": opts.dtype,
        "dims": vars(env.dims) | {"D": env.dims.D},
        "tiny_shapes": env.tiny,
        "quick": opts.quick,
        "mode": opts.mode,
        "seed": opts.seed,
        "qk_l2norm_in_kernel": not opts.no_qk_l2norm,
        "fault": fault,
        "fla_reason": peers.fla_reason or None,
    }


def _run_rows(
    rows: list[Row], ctx: Context, env: Env, opts: Options, base_record: dict[str, Any], copy: CopyBandwidth
) -> list[RowResult]:
    """Every row in turn; the JSON is rewritten after each (a run cut short keeps its rows), and
    the run stops at a row that broke the CUDA context."""
    results: list[RowResult] = []
    for row in rows:
        _progress(f"bench: {row.name} ...")
        try:
            res = bench_row(row, ctx, env)
        except Exception as e:  # one broken row (out of memory, a CUDA error) must not lose the rest
            res = crashed_row(row, env, e)
        results.append(res)
        _progress(f"bench: {row.name}: {res.status}, {res.mode}, {res.seconds:.1f} s")
        usable = env.device.type != "cuda" or device_usable(res)
        if opts.json:
            write_json(Path(opts.json), base_record, results, copy, complete=False)
        if not usable:
            break
    return results


def run_verdicts(base: dict[str, Any], results: list[RowResult]) -> list[Verdict] | None:
    """The run's verdicts on the chunk rows' targets (None: a run without targets, see `judged`)."""
    if not judged(base["dtype"], base["tiny_shapes"]):
        return None
    return verdicts(results, base["qk_l2norm_in_kernel"])


def write_json(
    path: Path, base: dict[str, Any], results: list[RowResult], copy: CopyBandwidth, *, complete: bool
) -> None:
    found = run_verdicts(base, results)
    record = {
        **base,
        "complete": complete,
        "copy": copy.record(),
        "rows": [r.record(copy.bytes_per_s) for r in results],
        "targets": None if found is None else [v.record() for v in found],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def _header(
    info: dict[str, Any],
    opts: Options,
    fla_version: str | None,
    copy: CopyBandwidth,
    tiny: bool,
    flashqla_version: str | None = None,
) -> list[str]:
    import triton

    dev = info["name"]
    if info.get("type") == "cuda":
        l2 = info.get("l2_bytes")
        dev += f" ({info['sms']} SMs" + (f", L2 {l2 / 2**20:.0f} MiB)" if l2 else ")")
    lines = [
        f"clef-runtime bench · {dev} · {opts.dtype} · torch {torch.__version__} · triton "
        f"{getattr(triton, '__version__', '?')} · FLA {fla_version or 'n/a'}"
        + (f" · FlashQLA {flashqla_version}" if flashqla_version else ""),
        f"copy bandwidth {copy.bytes_per_s / 1e9:.0f} GB/s (bytes read + written; {copy.nbytes / 2**30:.2f} GiB "
        f"copy, median of {len(copy.stats.samples)}, spread {100 * copy.stats.spread:.1f}%)",
        "times: median per call ± (p90-p10)/median; floor: byte floor / copy BW; BW: share of copy BW; "
        "FLA/clef (X/clef) > 1: clef faster, as the ratio of the medians (in brackets: p10-p90 of the "
        "ratios of samples taken side by side); host µs/call: the host's enqueue time per call in "
        "eager and idle modes (clef / FLA / each peer)",
    ]
    if tiny:
        lines.append("TINY SHAPES ON THE CPU (Triton interpreter, host clock): these numbers mean nothing")
    return lines
