"""The score of verify against kernel-source mutants (`source`), per dtype, on the CPU.

Per dtype: the clean kernels and the reference op set run every trigger (`triggers`, written
independently of verify's cases) once; the clean run is profiled to learn which @triton.jit
functions each trigger reaches.  Then each mutant, in turn:

1. *not reached*: no trigger runs its function at this dtype (it cannot be judged here);
2. it runs every trigger that reaches its function, in a forked process under a time limit:
   *raises* (any exception: not a silent bug), *crashes* (the process dies) or *hangs*; else
   *damaging* when `damage.damaged` finds a tensor past the harness's bound, else *undamaging*
   (an equivalent mutant on these inputs);
3. each damaging mutant runs verify's default Job (``--suite kernels``, reduced shapes, the CPU,
   this dtype) with the mutant in the op set, forked too; *caught* when the verdict is not
   ``pass``, or when that process dies or never finishes (no report: the operator's
   ``ReportMissing``).

Score = caught / damaging.  Not reached, raising, crashing, hanging and undamaging mutants are
counted apart, not in the score.  Ops the mutated module does not serve run under `memo` (the clean
run's calls replayed bit for bit), so a verify run costs the mutated op's cases only.

    PYTHONPATH=tests/runtime TRITON_INTERPRET=1 python -m mutants.score --json out.json
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import pickle
import platform
import random
import select
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import torch

import clef_runtime.ops
from clef_runtime.dtypes import torch_dtype
from clef_runtime.reference import REFERENCE_OPS
from clef_runtime.verify.run import VerifyArgs, run_verify

from .damage import Err, damaged, error
from .inject import injected
from .memo import Memo, memoised
from .source import Mutant, generate_all
from .triggers import TRIGGERS, Seen

OPS_ROOT = Path(clef_runtime.ops.__file__).parent
CLEAN_OPS = clef_runtime.ops.TRITON_OPS
Reach = tuple[str, str]  # (module stem, function name)


def isolated(fn: Callable[[], Any], limit_s: float) -> tuple[str, Any]:
    """Runs `fn` in a forked child (a mutant may write past a tensor and crash the process, or
    never finish): ("ok", its result), ("raises", text), ("crashes", text) or ("hangs", text).  The
    child inherits the clean runs and the memo; nothing it changes comes back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller (pytest, the CLI)
        os.close(r)
        torch.set_num_threads(1)  # the parent's OpenMP threads did not fork: use none
        faulthandler.disable()  # a crash is an outcome here, reported by the parent, not a traceback
        try:
            data = pickle.dumps(("ok", fn()))
        except BaseException as exc:  # everything a mutant raises is its outcome
            data = pickle.dumps(("raises", f"{type(exc).__name__}: {str(exc)[:300]}"))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + limit_s
    with os.fdopen(r, "rb", buffering=0) as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "hangs", f"over {limit_s:.0f} s"
            chunk = f.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if chunks:
        kind, value = pickle.loads(b"".join(chunks))
        return kind, value
    return (
        "crashes",
        f"child exit status {status} (signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else None})",
    )


def run_trigger(name: str, ops: SimpleNamespace, dtype: torch.dtype) -> dict[str, Seen]:
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return TRIGGERS[name](ops, gen, torch.device("cpu"), dtype)


def errors(seen: dict[str, Seen], ref: dict[str, Seen]) -> dict[str, Err]:
    return {k: error(s.tensor, ref[k].tensor, s.groups) for k, s in seen.items()}


@contextmanager
def reach_recorder(into: set[Reach]) -> Iterator[None]:
    """Records (module stem, function) of every function in the op modules that runs."""
    files = {str(p): p.stem for p in OPS_ROOT.glob("*.py")}

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            stem = files.get(frame.f_code.co_filename)
            if stem is not None:
                into.add((stem, frame.f_code.co_name))

    sys.setprofile(prof)
    try:
        yield
    finally:
        sys.setprofile(None)


@dataclass
class Clean:
    """One dtype's clean run: per trigger the reference's results, the clean kernels' errors,
    what they reach, which ops they call, how long they took."""

    dtype: torch.dtype
    refs: dict[str, dict[str, Seen]] = field(default_factory=dict)
    errors: dict[str, dict[str, Err]] = field(default_factory=dict)
    reached: dict[str, set[Reach]] = field(default_factory=dict)
    ops: dict[str, set[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def clean_run(dtype: torch.dtype, names: Iterable[str] = TRIGGERS) -> Clean:
    """The clean kernels and the reference on the triggers `names` (default: all)."""
    clean = Clean(dtype)
    for name in names:
        clean.refs[name] = run_trigger(name, REFERENCE_OPS, dtype)
        reached: set[Reach] = set()
        t0 = time.perf_counter()
        with reach_recorder(reached):
            seen = run_trigger(name, CLEAN_OPS, dtype)
        clean.seconds[name] = time.perf_counter() - t0
        clean.errors[name] = errors(seen, clean.refs[name])
        clean.reached[name] = reached
        clean.ops[name] = {s.op for s in seen.values()}
    return clean


@dataclass
class Outcome:
    id: str
    operator: str
    edit: str
    status: str  # not reached | raises | hangs | undamaging | damaging
    detail: str = ""
    caught: bool | None = None  # damaging only: verify's verdict was not pass
    verify: str = ""  # verify's summary line (damaging only)
    seconds: float = 0.0


def affected_ops(mutant: Mutant, clean: Clean) -> set[str]:
    """The ops whose triggers run any function of the mutated module: they run the real kernels
    under verify; the others replay the clean run (`memo`)."""
    stem = mutant.module.rsplit(".", 1)[-1]
    return {op for t, r in clean.reached.items() if any(s == stem for s, _ in r) for op in clean.ops[t]}


def verify_ops(affected: set[str], memo: Memo) -> SimpleNamespace:
    fast = memoised(CLEAN_OPS, memo)
    return SimpleNamespace(
        name="triton",
        **{op: getattr(CLEAN_OPS if op in affected else fast, op) for op in vars(fast) if op != "name"},
    )


def default_job(dtype_name: str, ops: SimpleNamespace) -> Any:
    """verify as the local cluster's default Job runs it (kernels suite, reduced shapes, the CPU),
    with `ops` as the Triton op set."""
    saved = clef_runtime.ops.TRITON_OPS
    clef_runtime.ops.TRITON_OPS = ops
    try:
        with tempfile.TemporaryDirectory() as tmp:
            args = VerifyArgs(
                suite="kernels",
                dtype=dtype_name,
                device="cpu",
                shapes="reduced",
                termination_log=f"{tmp}/log",
            )
            return run_verify(args)
    finally:
        clef_runtime.ops.TRITON_OPS = saved


def judge(
    mutant: Mutant, dtype_name: str, clean: Clean, memo: Memo, verify_limit_s: float = 900.0
) -> Outcome:
    t0 = time.perf_counter()
    out = Outcome(mutant.id, mutant.operator, f"{mutant.before}  →  {mutant.after}", "not reached")
    key = (mutant.module.rsplit(".", 1)[-1], mutant.function)
    triggers = sorted((t for t, r in clean.reached.items() if key in r), key=lambda t: clean.seconds[t])
    if not triggers:
        return out

    def damage() -> str:
        with injected(mutant):
            for t in triggers:
                seen = run_trigger(t, CLEAN_OPS, clean.dtype)
                found = damaged(errors(seen, clean.refs[t]), clean.errors[t], clean.dtype)
                if found:
                    return f"{t}: {found[0]}"
        return ""

    kind, value = isolated(damage, 60 + 4 * sum(clean.seconds[t] for t in triggers))
    if kind != "ok":
        out.status, out.detail = kind, value
    elif not value:
        out.status = "undamaging"
    else:
        out.status, out.detail = "damaging", value

        def job() -> tuple[str, str]:
            with injected(mutant):
                report = default_job(dtype_name, verify_ops(affected_ops(mutant, clean), memo))
            return report.verdict, report.summary()[:300]

        kind, value = isolated(job, verify_limit_s)
        if kind == "ok":
            out.caught, out.verify = value[0] != "pass", value[1]
        else:  # verify died or never finished: no report, which the operator judges ReportMissing
            out.caught, out.verify = True, f"verify {kind}: {value}"
    out.seconds = round(time.perf_counter() - t0, 2)
    return out


def sample(mutants: list[Mutant], reachable: Callable[[Mutant], bool], n: int, seed: int) -> list[Mutant]:
    """n mutants among those `reachable` accepts, spread evenly over the operators (round robin
    over a seeded shuffle of each operator's mutants)."""
    by_op: dict[str, list[Mutant]] = {}
    for m in mutants:
        if reachable(m):
            by_op.setdefault(m.operator, []).append(m)
    rng = random.Random(seed)
    for ms in by_op.values():
        rng.shuffle(ms)
    picked: list[Mutant] = []
    while len(picked) < n and any(by_op.values()):
        for op in sorted(by_op):
            if by_op[op] and len(picked) < n:
                picked.append(by_op[op].pop())
    return picked


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    counts = {s: 0 for s in ("not reached", "raises", "crashes", "hangs", "undamaging", "damaging")}
    for o in outcomes:
        counts[o.status] += 1
    counts["caught"] = sum(bool(o.caught) for o in outcomes)
    return counts


def score(
    dtypes: list[str],
    n: int,
    seed: int,
    modules: set[str] | None,
    log: Callable[[str], None],
    save: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """The whole run; `save` gets the result after each dtype (a partial run is kept)."""
    started = time.perf_counter()
    everything = generate_all(OPS_ROOT)
    pool = [m for m in everything if modules is None or m.module.rsplit(".", 1)[-1] in modules]
    cleans = {}
    for dt in dtypes:
        t0 = time.perf_counter()
        cleans[dt] = clean_run(torch_dtype(dt))
        log(f"{dt}: clean triggers in {time.perf_counter() - t0:.1f} s")
    reach = set().union(*(r for c in cleans.values() for r in c.reached.values()))
    picked = sample(pool, lambda m: True, n, seed)  # independent of the dtypes run: one sample for all
    result: dict[str, Any] = {
        "schema": "clef-source-mutants/1",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": platform.machine(),
        },
        "bound": "damage: a tensor's worst-group rel. RMS or peak error vs the reference > 2x the clean kernels' + one unit roundoff, or non-finite",
        "generated": len(everything),
        "generated_by_operator": {
            op: sum(m.operator == op for m in everything) for op in sorted({m.operator for m in everything})
        },
        "in_scope": len(pool),
        "reached_at_these_dtypes": sum((m.module.rsplit(".", 1)[-1], m.function) in reach for m in pool),
        "sampled": len(picked),
        "seed": seed,
        "dtypes": {},
    }
    for dt in dtypes:
        t0 = time.perf_counter()
        memo = Memo()
        clean_report = default_job(dt, verify_ops(set(), memo))
        outcomes = []
        for m in picked:
            o = judge(m, dt, cleans[dt], memo)
            outcomes.append(o)
            log(
                f"{dt} {o.status:11s} {'caught' if o.caught else '      ' if o.caught is None else 'MISSED'} {o.seconds:6.1f}s {o.id}  {o.edit[:80]}"
            )
        counts = tally(outcomes)
        result["dtypes"][dt] = {
            "clean_verify": clean_report.summary()[:300],
            "clean_verify_verdict": clean_report.verdict,
            "counts": counts,
            "score": f"{counts['caught']}/{counts['damaging']}",
            "seconds": round(time.perf_counter() - t0, 1),
            "mutants": [asdict(o) for o in outcomes],
        }
        log(f"{dt}: {counts} in {time.perf_counter() - t0:.0f} s")
        result["seconds"] = round(time.perf_counter() - started, 1)
        save(result)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="f16,bf16,f32")
    p.add_argument("--sample", type=int, default=100, help="mutants judged (the same ones at every dtype)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modules", default="", help="comma-separated op module stems (default: all)")
    p.add_argument("--json", required=True, help="where the result goes")
    a = p.parse_args(argv)
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        torch_dtype(d)  # an unknown name raises, naming it
    modules = {m for m in a.modules.split(",") if m} or None
    out = Path(a.json)
    result = score(
        dtypes,
        a.sample,
        a.seed,
        modules,
        lambda s: print(s, flush=True),
        lambda r: out.write_text(json.dumps(r, indent=1) + "\n"),
    )
    for dt, r in result["dtypes"].items():
        print(f"{dt}: caught {r['score']} damaging; {r['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
