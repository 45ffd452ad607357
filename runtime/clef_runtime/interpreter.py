"""Whether Triton runs kernels in its CPU interpreter, asked two ways.

`interpreting` reads the setting (``TRITON_INTERPRET``) as it stands; it imports nothing, so
`verify` and `bench` can ask before the first ``import triton``, which is when Triton reads it.
`interpreted` asks a kernel what it was decorated as, which is what counts once kernels exist
(the environment may have changed since the import).
`round_bf16_like_gpus` makes the interpreter's one float32 → bfloat16 cast round as GPUs do; the
kernels' package applies it on import whenever the interpreter is on, so `verify`, `goldens`,
`serve` and the tests on a CPU all measure the kernels, not the interpreter's rounding.
"""

from __future__ import annotations

import os
from typing import Any

ENV_VAR = "TRITON_INTERPRET"


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET`` switches the interpreter on (1, true, on, yes)."""
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "on", "yes")


def interpreted(kernel: object) -> bool:
    """Whether `kernel` (a ``@triton.jit`` function) runs in the interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


def round_bf16_like_gpus() -> bool:
    """Triton 3.6's interpreter casts float32 to bfloat16 by truncating the mantissa; GPUs round to
    nearest even.  Truncation doubles the rounding error of every bf16 output (most of the bf16
    tolerance), so a CPU run would measure the interpreter rather than the kernels.  Make that one
    cast round like the hardware (NaN stays NaN).  Idempotent.  Returns False, changing nothing,
    if the interpreter's internals are not the ones this was written against."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "cast_impl", None)
    tensor_handle = getattr(interpreter, "TensorHandle", None)
    if builder is None or original is None or tensor_handle is None:
        return False
    if getattr(original, "_clef_rtne", False):
        return True

    def cast_impl(self: object, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f = np.asarray(src.data, dtype=np.float32)
            bits = f.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            return tensor_handle(np.where(np.isnan(f), np.uint16(0x7FC0), rounded), dst_type.scalar)
        return original(self, src, dst_type)

    cast_impl._clef_rtne = True  # type: ignore[attr-defined]
    builder.cast_impl = cast_impl
    return True
