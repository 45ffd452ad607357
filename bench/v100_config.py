"""verify and the GPU test tier with the V100's FMA kernel configuration forced.

The homelab's V100 configuration, run for real on another GPU: `clef-runtime verify` with the
chunked delta rule's launch configuration forced to FMA (``--kernel-config fma``: FMA tiles,
row-by-row solve, IEEE dots; `clef_runtime.kernel_config`), f16, model shapes, kernels and full
suites; then the GPU test tier (``-m gpu``, whose f16-fma cases force the same configuration),
one pytest process per file, until the deadline.

Usage (GPU host, repository root):  OUT=.bench/v100 python3 bench/v100_config.py [DEADLINE_S]
Writes $OUT/v100_config.json (what docs/verification.md quotes), the two full verify reports and
the logs.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

OUT = Path(os.environ.get("OUT", ".bench/v100"))
DEADLINE_S = 380.0  # seconds from START; the first argument sets it
START = time.monotonic()
ENV = {
    **{k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CLEF_KERNEL_CONFIG")},
    "PYTHONPATH": "operator:runtime:contract:.",
    "PYTHONUNBUFFERED": "1",
    "CLEF_REQUIRE_GPU": "1",
}


def verify(suite: str, log: Path) -> dict[str, object]:
    report = OUT / f"verify-{suite}.json"
    cmd = [sys.executable, "-m", "clef_runtime", "verify", "--suite", suite, "--dtype", "f16"]
    cmd += ["--device", "cuda", "--shapes", "model", "--kernel-config", "fma", "--report", str(report)]
    t0 = time.monotonic()
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        env = {**ENV, "CLEF_TERMINATION_LOG": str(OUT / "termination-log")}
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=300).returncode
    wall = time.monotonic() - t0
    full = json.loads(report.read_text())
    ratios: dict[str, float] = {}
    for c in full["checks"]:
        if c["metric"] in ("rel_rms", "rel_max") and c["threshold"]:
            key = f"{c['op']} {c['metric']}"
            ratios[key] = max(ratios.get(key, 0.0), c["value"] / c["threshold"])
    return {
        "suite": suite,
        "exit_code": rc,
        "verdict": full["verdict"],
        "kernelConfig": full.get("kernelConfig"),
        "summary": full["summary"],
        "checks_passed": sum(c["passed"] for c in full["checks"]),
        "checks": len(full["checks"]),
        "wall_s": round(wall, 1),
        "durations": full["durations"],
        "peak_gpu_memory_bytes": full["peakGpuMemoryBytes"],
        "peak_gpu_memory_gib": round((full["peakGpuMemoryBytes"] or 0) / 2**30, 3),
        "worst_fraction_of_tolerance": {k: round(v, 4) for k, v in sorted(ratios.items())},
        "modelShape": full["modelShape"],
    }


def gpu_tier(log: Path, doc: dict[str, object]) -> dict[str, object]:
    files = [f for f in sorted(glob.glob("tests/runtime/test_*.py")) if "mark.gpu" in Path(f).read_text()]
    files.sort(key=lambda f: "delta_rule_chunk" not in f)  # the f16-fma cases first
    per_file: dict[str, object] = {}
    t0 = time.monotonic()
    for f in files:
        if time.monotonic() - START > DEADLINE_S:
            per_file[f] = "not run: deadline"
            continue
        # one process per file: an illegal address poisons the CUDA context for what follows
        cmd = [sys.executable, "-m", "pytest", f, "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        cmd += ["-o", "addopts=-ra"]
        t1 = time.monotonic()
        try:
            left = max(10.0, DEADLINE_S + 30 - (t1 - START))
            proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=left)
            out, rc = proc.stdout + proc.stderr, proc.returncode
            last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        except subprocess.TimeoutExpired as exc:
            out, rc, last = str(exc.stdout or ""), -1, "timed out at the deadline"
        with log.open("a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{out}\n")
        per_file[f] = {"exit_code": rc, "result": last, "wall_s": round(time.monotonic() - t1, 1)}
        doc["gpu_tier"] = {"wall_s": round(time.monotonic() - t0, 1), "files": per_file}
        (OUT / "v100_config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return {"wall_s": round(time.monotonic() - t0, 1), "files": per_file}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    import torch
    import triton

    doc: dict[str, object] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernel_config": "fma (forced): FMA tiles, row-by-row solve, IEEE dots (the V100's)",
    }
    vlog = OUT / "verify.log"
    doc["verify"] = [verify(s, vlog) for s in ("kernels", "full")]
    (OUT / "v100_config.json").write_text(json.dumps(doc, indent=2) + "\n")
    doc["gpu_tier"] = gpu_tier(OUT / "gpu-tests.log", doc)
    (OUT / "v100_config.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        DEADLINE_S = float(sys.argv[1])
    main()
