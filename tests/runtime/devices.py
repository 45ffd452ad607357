"""Where the runtime's CPU-tier tests run, known at collection: CUDA with compiled kernels when a
GPU is present and the interpreter is off, else the CPU (the `device` fixture of conftest.py)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from clef_runtime.interpreter import interpreting


def compiled_on_cuda() -> bool:
    return torch.cuda.is_available() and not interpreting()


def tier_device() -> torch.device:
    return torch.device("cuda") if compiled_on_cuda() else torch.device("cpu")


def where_values_are_checked(cases: Iterable[str], value_cases: Iterable[str]) -> list[str]:
    """`cases` without `value_cases` when the tests run on CUDA: an op checks the *values* of an
    index tensor (cu_seqlens, state indices) only when it is on the CPU, because reading a device
    tensor's values would sync with the host.  Those cases are not collected there at all (not
    skipped): the CPU tier (make test-runtime, CI) runs them."""
    value = set(value_cases)
    return [c for c in cases if not (compiled_on_cuda() and c in value)]
