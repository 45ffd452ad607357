"""Session-wide test setup.  Kept minimal: tier-specific fixtures live in each tier's conftest."""

from __future__ import annotations

import os

try:
    import torch
except ImportError:  # the operator-only environment has no torch and no Triton kernels to run
    torch = None  # type: ignore[assignment]

# Triton decides between compiling and interpreting when a kernel is *decorated*, i.e. when the
# module defining it is first imported; a test anywhere may import the runtime ops, so the choice
# has to be made here, before any test module is collected.  Without CUDA the kernels can only run
# under the interpreter (how CI runs them); an explicit TRITON_INTERPRET always wins.
if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
