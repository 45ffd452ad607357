"""The GPU tier cannot pass by skipping where a GPU is required: with ``CLEF_REQUIRE_GPU=1`` (what
``make test-gpu`` sets) a missing GPU fails every gpu test; without it they skip with the reason.
Run in a subprocess with every CUDA device hidden, so it holds on a GPU host too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_gpu_tier(required: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CLEF_REQUIRE_GPU"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    if required:
        env["CLEF_REQUIRE_GPU"] = "1"
    # the norm tests: a small module with gpu tests (collection imports the kernels, little else)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/runtime/test_ops_norm.py",
        "-q",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_required_gpu_tier_fails_without_a_gpu() -> None:
    proc = run_gpu_tier(required=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "gpu tier required (CLEF_REQUIRE_GPU) but no CUDA device" in out, out[-3000:]
    assert " passed" not in out and "skipped" not in out, out[-3000:]


def test_gpu_tier_skips_with_the_reason_when_not_required() -> None:
    proc = run_gpu_tier(required=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "skip: no CUDA device (the gpu tier runs on a CUDA host: make test-gpu)" in out, out[-3000:]
    assert " error" not in out and " failed" not in out, out[-3000:]
