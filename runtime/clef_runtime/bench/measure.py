"""One benchmark row (``clef-runtime bench``): draw the rotated input sets; call each
implementation once (compile, autotune); poison the allocator and check clef against FLA on a fresh
set, so that a fast wrong kernel never gets a number; warm up; decide eager or CUDA-graph timing;
time the implementations interleaved.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from clef_runtime.bench.floors import Dims, Floor
from clef_runtime.bench.report import Check, RowResult, row_note_texts
from clef_runtime.bench.row_types import Context, Impl, Row, Setup, Tensors
from clef_runtime.bench.rows import rotation_sets
from clef_runtime.bench.timing import Budget, Round, Stats, capture_graph, host_sync, synchronize, time_rounds

MIN_SETS = 8
MAX_SETS = 2048


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


def single_calls(run: Callable[[Tensors], Tensors], sets: list[Tensors]) -> Round:
    """One call a round, on the next of `sets` each time (mode idle)."""
    turn = itertools.cycle(sets)

    def go() -> None:
        run(next(turn))

    return go


def _time(
    rounds: list[Round], calls: list[int], env: Env, row: Row, names: list[str]
) -> tuple[str, list[Stats], list[str]]:
    """(mode, stats per implementation, notes)."""
    notes: list[str] = []
    if env.device.type != "cuda":
        return "host", time_rounds(rounds, calls, env.device, env.budget), notes
    if env.mode == "idle":
        return "idle", time_rounds(rounds, calls, env.device, env.budget, idle=True), notes
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
        return crashed_row(row, env, RuntimeError(f"setup failed: {type(e).__name__}: {e}"))
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
    if env.mode == "idle":  # one call a sample, each from an idle GPU
        rounds = [single_calls(i.run, prepared[i.name]) for i in impls]
        calls = [1] * len(impls)
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


def device_usable(res: RowResult) -> bool:
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


def crashed_row(row: Row, env: Env, e: BaseException) -> RowResult:
    B, T = row.tiny if env.tiny else row.full
    res = RowResult(row.name, row.op, f"B{B} T{T}", Floor({}), status="error")
    res.clef.na = f"row crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    res.notes = row_note_texts(res)
    return res


def _finish(res: RowResult, notes: list[str], t0: float) -> RowResult:
    res.notes = row_note_texts(res) + notes
    res.seconds = time.perf_counter() - t0
    return res
