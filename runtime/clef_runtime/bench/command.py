"""``clef-runtime bench``: argument parsing and the run (docs/performance.md has the method).

Per row: draw the rotated input sets; call each implementation once (compile, autotune); poison
the allocator and check clef against FLA on a fresh set, so that a fast wrong kernel never gets a
number; warm up; decide eager or CUDA-graph timing; time the implementations interleaved.  The
copy bandwidth that the shares are computed against is measured at the start of the same run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_contract.command import FAULT_ENV
from clef_runtime.bench.floors import QWEN35_9B, TINY, Dims, Floor
from clef_runtime.bench.report import (
    SCHEMA,
    Check,
    RowResult,
    number_notes,
    row_note_texts,
    table_lines,
)
from clef_runtime.bench.rows import ROWS, Context, Impl, Row, Setup, Tensors, rotation_sets, select_rows
from clef_runtime.bench.timing import (
    Budget,
    CopyBandwidth,
    Round,
    Stats,
    capture_graph,
    host_sync,
    measure_copy_bandwidth,
    synchronize,
    time_rounds,
)
from clef_runtime.dtypes import NAMES, torch_dtype
from clef_runtime.interpreter import interpreting

if TYPE_CHECKING:
    from clef_runtime.opset import OpSet

# clef vs FLA, relative L2 error per output: loose, a wrong kernel is off by O(1)
TOLERANCE = {"bf16": 5e-2, "f16": 2e-2, "f32": 1e-2}
MIN_SETS = 8
MAX_SETS = 2048
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
            "measured in the same run.  Prints an aligned table last; --json writes everything."
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
        choices=("auto", "eager", "graph"),
        default="auto",
        help="auto (default): graph rows and decode rows replay a CUDA graph, the others launch "
        "eagerly unless that turns out host-bound; eager/graph: force one for every row",
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


@dataclass(frozen=True)
class Env:
    device: torch.device
    tiny: bool
    dims: Dims
    budget: Budget
    rotate_bytes: int
    set_memory: int
    tolerance: float
    mode: str
    seed: int


def _budget(opts: Options, tiny: bool) -> Budget:
    if tiny:
        return Budget(seconds=0.0, min_samples=2, max_samples=2, warmup_rounds=1)
    if opts.quick:
        return Budget(seconds=opts.seconds if opts.seconds is not None else 0.2, min_samples=5,
                      max_samples=50, warmup_rounds=1)  # fmt: skip
    return Budget(seconds=opts.seconds if opts.seconds is not None else 1.0, min_samples=20,
                  max_samples=500, warmup_rounds=3)  # fmt: skip


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"name": platform.processor() or platform.machine() or "cpu", "type": "cpu"}
    props = torch.cuda.get_device_properties(device)
    return {
        "type": "cuda",
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "cuda": torch.version.cuda,
    }


def _git_commit() -> str | None:
    """The checkout's commit, with ``-dirty`` where the files differ from it (a working tree
    copied onto a bench host without its new commits reads as its old commit, dirty)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _versions(fla_version: str | None) -> dict[str, Any]:
    import triton

    from clef_runtime import __version__

    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", "unknown"),
        "clef_runtime": __version__,
        "fla": fla_version,
        "git": _git_commit(),
    }
    try:
        from importlib.metadata import version

        v["fla_core"] = version("fla-core") if fla_version else None
    except Exception:
        v["fla_core"] = None
    return v


# ---- one row --------------------------------------------------------------------------------------


def _outputs_ok(name: str, out: Tensors) -> list[str]:
    problems = []
    for key, t in out.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            problems.append(f"{name} output {key} has non-finite values (unwritten or overflowed)")
        elif t.numel() and not bool(t.any()):
            problems.append(f"{name} output {key} is all zeros")
    return problems


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a32, b32 = a.float(), b.float()
    den = float(b32.norm())
    num = float((a32 - b32).norm())
    return num / den if den > 0 else num


def _storage_sizes(out: Tensors) -> list[int]:
    return sorted({int(t.untyped_storage().nbytes()) for t in out.values()}, reverse=True)


def _poison(device: torch.device, sizes: Sequence[int]) -> None:
    """Fill freed allocator blocks of the outputs' sizes with NaN bytes (0xFF is NaN in f32, bf16
    and f16), so that an output element the kernel never writes shows up as non-finite instead of
    a stale right answer from the previous call.  Best effort: the caching allocator usually hands
    a freed block of the same size straight back."""
    if device.type != "cuda":
        return
    blocks = [torch.empty(n, dtype=torch.uint8, device=device).fill_(0xFF) for n in sizes]
    synchronize(device)
    del blocks


def _round(run: Callable[[Tensors], Tensors], sets: list[Tensors]) -> Round:
    def go() -> None:
        for s in sets:
            run(s)

    return go


def _time(
    rounds: list[Round], calls: list[int], env: Env, row: Row, names: list[str]
) -> tuple[str, list[Stats], list[str]]:
    """(mode, stats per implementation, notes)."""
    notes: list[str] = []
    if env.device.type != "cuda":
        return "host", time_rounds(rounds, calls, env.device, env.budget), notes
    graph = env.mode == "graph" or (env.mode == "auto" and row.graph)
    bound: list[str] = []
    if env.mode == "auto" and not row.graph:
        probe = time_rounds(rounds, calls, env.device, Budget(0.0, 5, 5, 0))
        bound = [n for n, s in zip(names, probe, strict=True) if s.host_bound]
        graph = bool(bound)
    if graph:
        # a call that syncs with the host cannot be captured: time the row eagerly rather than
        # try (a capture that fails part-way can leave the process unsafe: `host_sync`)
        syncing = [n for n, r in zip(names, rounds, strict=True) if host_sync(r) is not None]
        if syncing:
            graph = False
            notes.append(
                f"not timed by CUDA-graph replay: {' and '.join(syncing)} synchronises with the host "
                "(a capture would fail); timed eagerly"
            )
    timed = rounds
    mode = "eager"
    if graph:
        if bound:
            notes.append(
                f"launched eagerly, {' and '.join(bound)} was host-bound (the GPU waited on Python): "
                "timed by CUDA-graph replay instead"
            )
        try:
            timed = [capture_graph(r, env.device) for r in rounds]
            mode = "graph*" if bound else "graph"
        except Exception as e:
            synchronize(env.device)
            notes.append(f"CUDA-graph capture failed ({type(e).__name__}: {e}); timed eagerly")
            timed = rounds
    stats = time_rounds(timed, calls, env.device, env.budget)
    bound = [n for n, s in zip(names, stats, strict=True) if s.host_bound]
    if bound:
        how = "launched eagerly" if mode == "eager" else "even replayed from a CUDA graph"
        notes.append(f"{' and '.join(bound)} host-bound {how}: the time includes launch overhead")
    return mode, stats, notes


def bench_row(row: Row, ctx: Context, env: Env) -> RowResult:
    """One row: build it, call every implementation once (compile, autotune), check their outputs
    on a fresh set with the allocator poisoned, then time the ones that passed."""
    B, T = row.tiny if env.tiny else row.full
    t0 = time.perf_counter()
    try:
        setup = row.build(ctx, B, T)
    except Exception as e:
        return _crashed(row, env, RuntimeError(f"setup failed: {type(e).__name__}: {e}"))
    res = RowResult(row.name, row.op, setup.case, setup.floor, show_tflops=setup.show_tflops)
    res.fla.na = setup.fla_missing
    for name, why in setup.peer_missing.items():
        res.impl(name).na = why
    notes = setup.notes + (setup.fla_notes if ctx.fla is not None else [])
    impls: list[Impl] = [setup.clef] + ([setup.fla] if setup.fla is not None else []) + setup.peers
    base = env.seed * 100_003 + 1
    sets = _rotation_sets(res, setup, env, base)
    prepared, sizes = _first_calls(res, impls, sets, env)
    if res.status == "error":
        return _finish(res, notes, t0)
    impls = _checked(res, setup, [i for i in impls if i.name in prepared], env, base, sizes)
    if res.status != "ok":
        return _finish(res, notes, t0)
    return _timed(res, row, impls, prepared, env, notes, t0)


def _rotation_sets(res: RowResult, setup: Setup, env: Env, base: int) -> list[Tensors]:
    """Input sets to rotate through while timing, enough to overflow the L2 (2 on the CPU)."""
    first = setup.make_set(base + 1)
    res.set_bytes = sum(int(t.nbytes) for t in first.values())
    if env.tiny:
        n_sets = 2
    else:
        n_sets = rotation_sets(
            res.set_bytes, setup.shared_bytes, env.rotate_bytes, MIN_SETS, MAX_SETS, env.set_memory
        )
    res.rotation = n_sets
    return [first] + [setup.make_set(base + 1 + i) for i in range(1, n_sets)]


def _failed(res: RowResult, impl: Impl, what: str, e: BaseException) -> None:
    """`impl` raised: it reads n/a with why; clef's failure fails the row, a clef variant's the run."""
    msg = f"{what} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if impl.name == "clef":
        res.status = "error"
    elif impl.name.startswith("clef"):
        res.peer_failed = True
    res.impl(impl.name).na = msg


def _first_calls(
    res: RowResult, impls: list[Impl], sets: list[Tensors], env: Env
) -> tuple[dict[str, list[Tensors]], dict[str, list[int]]]:
    """Compile / autotune on rotation set 0: each implementation's prepared sets and its outputs'
    storage sizes (to poison before the check); one that raises is left out of both."""
    prepared: dict[str, list[Tensors]] = {}
    sizes: dict[str, list[int]] = {}
    for impl in impls:
        try:
            prepared[impl.name] = [impl.prepare(s) for s in sets]
            out = impl.run(prepared[impl.name][0])
            synchronize(env.device)
            sizes[impl.name] = _storage_sizes(out)
            del out
        except Exception as e:
            _failed(res, impl, "first call", e)
            prepared.pop(impl.name, None)
    return prepared, sizes


def _checked(
    res: RowResult, setup: Setup, impls: list[Impl], env: Env, base: int, sizes: dict[str, list[int]]
) -> list[Impl]:
    """Call each implementation on a fresh set with the allocator poisoned and judge the outputs
    (`res.check`, `res.status`); the implementations still to time."""
    check = Check(tolerance=env.tolerance, against="fla" if setup.fla in impls else "sanity")
    outs: dict[str, Tensors] = {}
    for impl in list(impls):
        try:
            fresh = impl.prepare(setup.make_set(base))
            _poison(env.device, sizes[impl.name])
            outs[impl.name] = impl.run(fresh)
            synchronize(env.device)
        except Exception as e:
            _failed(res, impl, "check call", e)
            impls.remove(impl)
    if res.status == "error":
        return impls
    impls = _judge(res, check, impls, outs)
    res.check = check
    if res.status == "ok":
        impls = _check_peers(res, check, impls, outs)
    return impls


def _judge(res: RowResult, check: Check, impls: list[Impl], outs: dict[str, Tensors]) -> list[Impl]:
    """clef's outputs must be sane, and agree with FLA's where FLA's are sane (else FLA is not
    timed and the check falls back to sanity)."""
    clef_problems = _outputs_ok("clef", outs["clef"])
    if clef_problems:
        check.problems.extend(clef_problems)
        res.status = "invalid"
        return impls
    if "fla" not in outs:
        return impls
    fla_problems = _outputs_ok("FLA", outs["fla"])
    if fla_problems:
        res.fla.na = "; ".join(fla_problems)
        check.against = "sanity"
        return [i for i in impls if i.name != "fla"]
    for key, t in outs["clef"].items():
        check.rel_err[key] = _rel_err(t, outs["fla"][key])
    if not check.ok:
        res.status = "mismatch"
    return impls


def _timed(
    res: RowResult,
    row: Row,
    impls: list[Impl],
    prepared: dict[str, list[Tensors]],
    env: Env,
    notes: list[str],
    t0: float,
) -> RowResult:
    """Warm up, then time every implementation over its rotation sets."""
    names = [i.name for i in impls]
    rounds = [_round(i.run, prepared[i.name]) for i in impls]
    calls = [len(prepared[i.name]) for i in impls]
    for _ in range(env.budget.warmup_rounds):
        for r in rounds:
            r()
    synchronize(env.device)
    try:
        mode, stats, timing_notes = _time(rounds, calls, env, row, names)
    except Exception as e:
        res.status = "error"
        res.clef.na = f"timing failed: {type(e).__name__}: {e}"
        return _finish(res, notes, t0)
    res.mode = mode
    for name, st in zip(names, stats, strict=True):
        res.impl(name).stats = st
    return _finish(res, notes + timing_notes, t0)


def _check_peers(res: RowResult, check: Check, impls: list[Impl], outs: dict[str, Tensors]) -> list[Impl]:
    """Check every peer's outputs against FLA's (clef's when FLA is not there); a peer that fails
    is not timed and reads n/a with the reason (and fails the run when it is clef's own)."""
    ref_name = "fla" if check.against == "fla" else "clef"
    keep = []
    for impl in impls:
        if impl.name in ("clef", "fla"):
            keep.append(impl)
            continue
        out = outs[impl.name]
        problems = _outputs_ok(impl.name, out)
        errs = {} if problems else {k: _rel_err(out[k], outs[ref_name][k]) for k in outs["clef"]}
        check.peer_rel_err[impl.name] = errs
        bad = [f"{k} {e:.3g}" for k, e in errs.items() if e > check.tolerance]
        if bad:
            problems.append(
                f"disagrees with {ref_name}: relative error {', '.join(bad)} > {check.tolerance:g}"
            )
        if problems:
            res.impl(impl.name).na = "; ".join(problems) + "; not timed"
            res.peer_failed = res.peer_failed or impl.name.startswith("clef")
        else:
            keep.append(impl)
    return keep


def _device_usable(res: RowResult) -> bool:
    """Free the row's memory; False when the CUDA context is broken (a kernel of this row faulted,
    e.g. an illegal address, which poisons every later call): the run stops with the rows so far,
    and this row says so."""
    try:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
    except Exception as e:
        res.status = "error"
        res.notes.append(
            f"the CUDA context broke during this row ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "an asynchronous fault cannot be pinned on one implementation, and no later row ran"
        )
        return False
    return True


def _crashed(row: Row, env: Env, e: BaseException) -> RowResult:
    B, T = row.tiny if env.tiny else row.full
    res = RowResult(row.name, row.op, f"B{B} T{T}", Floor({}), status="error")
    res.clef.na = f"row crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    res.notes = row_note_texts(res)
    return res


def _finish(res: RowResult, notes: list[str], t0: float) -> RowResult:
    res.notes = row_note_texts(res) + notes
    res.seconds = time.perf_counter() - t0
    return res


# ---- the command ----------------------------------------------------------------------------------


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
        fla_backend=_fla_backend(peers.flashqla is not None),
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
        "versions": {**_versions(peers.fla_version), "flash_qla": peers.flashqla_version},
        "fla_env": _fla_env(),
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
            res = _crashed(row, env, e)
        results.append(res)
        _progress(f"bench: {row.name}: {res.status}, {res.mode}, {res.seconds:.1f} s")
        usable = env.device.type != "cuda" or _device_usable(res)
        if opts.json:
            write_json(Path(opts.json), base_record, results, copy, complete=False)
        if not usable:
            break
    return results


def write_json(
    path: Path, base: dict[str, Any], results: list[RowResult], copy: CopyBandwidth, *, complete: bool
) -> None:
    record = {
        **base,
        "complete": complete,
        "copy": copy.record(),
        "rows": [r.record(copy.bytes_per_s) for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def _fla_backend(flashqla_loaded: bool) -> str:
    from importlib.util import find_spec

    from clef_runtime.bench.fla_peer import fla_chunk_backend

    try:
        importable = flashqla_loaded or find_spec("flash_qla") is not None
    except (ImportError, ValueError):
        importable = False
    return fla_chunk_backend(importable)


def _fla_env() -> dict[str, str]:
    from clef_runtime.bench.fla_peer import fla_environment

    return fla_environment()


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
        "ratios of samples taken side by side)",
    ]
    if tiny:
        lines.append("TINY SHAPES ON THE CPU (Triton interpreter, host clock): these numbers mean nothing")
    return lines
