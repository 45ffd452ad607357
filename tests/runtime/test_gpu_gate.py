"""The GPU tier cannot pass by skipping where a GPU is required: with ``CLEF_REQUIRE_GPU=1`` (what
``make test-gpu`` sets) a missing GPU fails every gpu test; without it they skip with the reason.
Run in a subprocess with every CUDA device hidden, so it holds on a GPU host too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# (required, exit code, what the output must say, what it must not)
CASES = {
    "required-fails": (
        True,
        1,
        "gpu tier required (CLEF_REQUIRE_GPU) but no CUDA device",
        (" passed", "skipped"),
    ),
    "optional-skips": (
        False,
        0,
        "skip: no CUDA device (the gpu tier runs on a CUDA host: make test-gpu)",
        (" error", " failed"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gpu_tier_without_a_gpu(case: str) -> None:
    required, code, says, never = CASES[case]
    proc = run_gpu_tier(required)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert says in out, out[-3000:]
    assert not [w for w in never if w in out], out[-3000:]
