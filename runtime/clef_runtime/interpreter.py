"""Whether Triton runs kernels in its CPU interpreter, asked two ways.

`interpreting` reads the setting (``TRITON_INTERPRET``) as it stands; it imports nothing, so
`verify` and `bench` can ask before the first ``import triton``, which is when Triton reads it.
`interpreted` asks a kernel what it was decorated as, which is what counts once kernels exist
(the environment may have changed since the import).
"""

from __future__ import annotations

import os

ENV_VAR = "TRITON_INTERPRET"


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET`` switches the interpreter on (1, true, on, yes)."""
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "on", "yes")


def interpreted(kernel: object) -> bool:
    """Whether `kernel` (a ``@triton.jit`` function) runs in the interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"
