"""The interpreter's float32 → bfloat16 cast rounds like a GPU (`clef_runtime.interpreter`).

Without it, every bf16 output on the CPU carries twice the rounding error a GPU would give, and
`verify --dtype bf16` on a CPU measures the interpreter instead of the kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from clef_runtime.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="skip: checks Triton's CPU interpreter, which this process did not choose: rerun with "
    "TRITON_INTERPRET=1 (make test-runtime sets it)",
)


def test_kernel_cast_rounds_to_nearest_even() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(tl.bfloat16), mask=mask)

    g = torch.Generator().manual_seed(0)
    # Values whose low 16 bits sit above, below and exactly at the halfway point, and a NaN.
    x = torch.randn(1000, generator=g)
    halfway = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8)], dtype=torch.float32)
    x = torch.cat([x, halfway, torch.tensor([float("nan")])])
    y = torch.empty_like(x, dtype=torch.bfloat16)
    cast[(1,)](x, y, x.numel(), BLOCK=1024)
    expected = x.to(torch.bfloat16)  # torch rounds to nearest even, as GPUs do
    assert torch.equal(y[:-1].view(torch.int16), expected[:-1].view(torch.int16))
    assert torch.isnan(y[-1])


def test_importing_the_kernels_applies_it() -> None:
    """What `verify`, `goldens` and `serve` get on a CPU: no test conftest, just the package.  It
    applies `patch_language_once_per_launch` too (tests/runtime/test_interpreter_patching.py)."""
    code = (
        "import clef_runtime.ops\n"
        "from triton.runtime import interpreter\n"
        "assert getattr(interpreter.InterpreterBuilder.cast_impl, '_clef_rtne', False)\n"
        "assert type(interpreter._patch_lang).__name__ == '_LanguagePatches', interpreter._patch_lang\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
