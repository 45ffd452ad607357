"""The GPU run behind docs/verification.md (not a test): verify's default Job at the model's shapes
on a CUDA device, as the operator runs it, plus the contract mutants (`catalogue`) through the same Job.

    OUT=/some/dir PYTHONPATH=operator:runtime:contract:.:tests/runtime python3 tests/runtime/mutants/device_run.py

Writes to $OUT: ``kernels-<dtype>[-cold].json`` (full verify reports: every check's healthy value,
durations, peak GPU memory), ``runs.json`` (wall time of each CLI run) and ``mutants.json`` (each
mutant: caught or not, the first failing check).  The mutant runs are in-process and run only the
cases that call the mutated op (found by recording a clean run): a case that never calls the op
computes exactly what it computes without the mutant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(os.environ["OUT"])
BUDGET_S = float(os.environ.get("BUDGET_S", "380"))
MUTANT_BUDGET_S = float(os.environ.get("MUTANT_BUDGET_S", "220"))  # elapsed time the mutants stop at
# a dry run on a CPU host: DEVICE=cpu SHAPES=reduced (the mutant part only, with MUTANTS_ONLY=1)
DEVICE, SHAPES = os.environ.get("DEVICE", "cuda"), os.environ.get("SHAPES", "model")
START = time.monotonic()


def cli(dtype: str, tag: str) -> dict[str, Any]:
    report = OUT / f"kernels-{tag}.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "verify", "--suite", "kernels", "--dtype", dtype,
         "--device", DEVICE, "--shapes", SHAPES, "--report", str(report),
         "--termination-log", str(OUT / f"compact-{tag}.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - t0
    doc = json.loads(report.read_text()) if report.exists() else {}
    row = {"tag": tag, "exit": proc.returncode, "wall_s": round(wall, 2), "summary": doc.get("summary"),
           "durations": doc.get("durations"), "peakGpuMemoryBytes": doc.get("peakGpuMemoryBytes")}  # fmt: skip
    print(json.dumps(row), flush=True)
    if proc.returncode not in (0, 1):
        print(proc.stderr[-3000:], flush=True)
    return row


def mutants() -> dict[str, Any]:

    import clef_runtime.ops
    from clef_runtime.model.config import preset
    from clef_runtime.verify import kernels
    from clef_runtime.verify.run import REDUCED_HEADS, VerifyArgs, run_verify
    from mutants.catalogue import MUTANTS, Shape

    cfg = preset("qwen3_5")
    if SHAPES == "reduced":
        cfg = cfg.replace(**REDUCED_HEADS)
    shape = Shape(cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                  cfg.linear_value_head_dim)  # fmt: skip
    healthy = clef_runtime.ops.TRITON_OPS
    all_cases = kernels.CASES
    calls: dict[str, set[str]] = {}
    current = [""]

    def recording() -> Any:
        from types import SimpleNamespace

        def wrap(op: str) -> Any:
            def call(*a: Any, **kw: Any) -> Any:
                calls.setdefault(op, set()).add(current[0])
                return getattr(healthy, op)(*a, **kw)

            return call

        return SimpleNamespace(name="triton", **{op: wrap(op) for op in vars(healthy) if op != "name"})

    def traced(case: Any) -> Any:
        def run(*a: Any) -> Any:
            current[0] = case.__name__
            return case(*a)

        run.__name__ = case.__name__
        return run

    def job() -> Any:
        return run_verify(VerifyArgs(suite="kernels", dtype="f16", device=DEVICE, shapes=SHAPES,
                                     termination_log=str(OUT / "mutant-log")))  # fmt: skip

    clef_runtime.ops.TRITON_OPS = recording()
    kernels.CASES = tuple(traced(c) for c in all_cases)
    clean = job()
    rows: list[dict[str, Any]] = []
    result = {"clean": clean.summary(), "clean_verdict": clean.verdict, "cases_per_op":
              {op: sorted(cs) for op, cs in calls.items()}, "mutants": rows}  # fmt: skip
    for m in MUTANTS:
        if time.monotonic() - START > MUTANT_BUDGET_S:
            rows.append({"name": m.name, "skipped": "out of time"})
            continue
        clef_runtime.ops.TRITON_OPS = m.apply(healthy, shape)
        kernels.CASES = tuple(c for c in all_cases if c.__name__ in calls.get(m.op, set()))
        t0 = time.monotonic()
        r = job()
        first = r.failing[0] if r.failing else None
        rows.append({"name": m.name, "op": m.op, "caught": r.verdict == "fail", "verdict": r.verdict,
                     "error": r.error, "cases": len(kernels.CASES), "s": round(time.monotonic() - t0, 2),
                     "first_failing": first.detail or first.name if first else None,
                     "failing": len(r.failing)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    clef_runtime.ops.TRITON_OPS = healthy
    kernels.CASES = all_cases
    result["caught"] = sum(1 for r in rows if r.get("caught"))
    result["total"] = len(MUTANTS)
    return result


def main() -> None:
    import torch
    import triton

    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "gpu": gpu,
           "torch": torch.__version__, "triton": triton.__version__}  # fmt: skip
    print(json.dumps(env), flush=True)
    if os.environ.get("MUTANTS_ONLY"):
        m = mutants()
        print("mutants caught", m["caught"], "/", m["total"], flush=True)
        return
    runs = [cli("f16", "f16-cold"), cli("f16", "f16")]
    (OUT / "runs.json").write_text(json.dumps({"env": env, "runs": runs}, indent=2))
    m = mutants()
    (OUT / "mutants.json").write_text(json.dumps({"env": env, **m}, indent=2))
    print("mutants caught", m["caught"], "/", m["total"], flush=True)
    for dtype, tag in (("bf16", "bf16-cold"), ("f32", "f32"), ("bf16", "bf16")):
        if time.monotonic() - START > BUDGET_S - 40:
            print("skipped", tag, "(out of time)", flush=True)
            continue
        runs.append(cli(dtype, tag))
        (OUT / "runs.json").write_text(json.dumps({"env": env, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
