"""Helper calls inside an interpreted kernel patch ``triton.language`` once per launch
(`clef_runtime.interpreter.patch_language_once_per_launch`), with the same results as Triton's
own way, which patches it again at every helper call.  That importing the kernels applies it is
checked with the rounding fix (tests/runtime/test_interpreter_rounding.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from clef_runtime.interpreter import interpreting, patch_language_once_per_launch

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="skip: checks Triton's CPU interpreter, which this process did not choose: rerun with "
    "TRITON_INTERPRET=1 (make test-runtime sets it)",
)

ROWS, STEPS, BLOCK = 3, 5, 16


@triton.jit
def _scaled(x, s):
    return x * s + 1.0


@triton.jit
def _helpers_kernel(x_ptr, y_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # a helper of triton.language.standard
    for i in range(STEPS):
        x = tl.load(x_ptr + (row * STEPS + i) * BLOCK + offs)
        acc += tl.sigmoid(_scaled(x, 0.5))  # one of this module's, one of the standard library's
    tl.store(y_ptr + row * BLOCK + offs, acc)


def _run() -> torch.Tensor:
    x = torch.randn(ROWS * STEPS * BLOCK, generator=torch.Generator().manual_seed(0))
    y = torch.empty(ROWS * BLOCK)
    _helpers_kernel[(ROWS,)](x, y, STEPS=STEPS, BLOCK=BLOCK)
    return y


def _counting(original: Callable[[Any], Any], names: list[str]) -> Callable[[Any], Any]:
    def patch(fn: Any) -> Any:
        names.append(fn.__name__)
        return original(fn)

    return patch


def test_helpers_patch_the_language_once_per_launch_with_the_same_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triton.runtime import interpreter

    assert patch_language_once_per_launch(), "the interpreter's internals are not the expected ones"
    patches = interpreter._patch_lang
    triton_way: list[str] = []
    with monkeypatch.context() as m:
        # Triton's own `_patch_lang`, counted, in place of the stand-in: every helper call patches
        m.setattr(interpreter, "_patch_lang", _counting(patches.original, triton_way))
        expected = _run()
    once: list[str] = []
    monkeypatch.setattr(patches, "original", _counting(patches.original, once))
    got = _run()

    assert torch.equal(got, expected)
    # a launch: the kernel, then triton.language.standard's first helper (it sees
    # triton.language.core too); every later helper call finds its modules patched
    assert once == ["_helpers_kernel", "zeros"], once
    per_program = 1 + 2 * STEPS  # zeros, then _scaled and sigmoid at every step
    assert triton_way.count("_scaled") == ROWS * STEPS and len(triton_way) == 1 + ROWS * per_program, (
        triton_way
    )


def test_the_language_is_restored_after_a_launch() -> None:
    patch_language_once_per_launch()
    before = {name: getattr(tl, name) for name in ("load", "store", "sigmoid", "zeros", "exp")}
    core_before = tl.core.tensor.__add__
    _run()
    assert {name: getattr(tl, name) for name in before} == before
    assert tl.core.tensor.__add__ is core_before


def test_a_failing_launch_leaves_no_launch_behind() -> None:
    from triton.runtime import interpreter

    patch_language_once_per_launch()
    with pytest.raises(interpreter.InterpreterError, match="power of 2"):  # tl.arange(0, 17)
        _helpers_kernel[(1,)](torch.empty(1), torch.empty(1), STEPS=STEPS, BLOCK=BLOCK + 1)
    assert interpreter._patch_lang.launches() == []
