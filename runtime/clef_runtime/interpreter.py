"""Whether Triton runs kernels in its CPU interpreter, asked two ways.

`interpreting` reads the setting (``TRITON_INTERPRET``) as it stands; it imports nothing, so
`verify` and `bench` can ask before the first ``import triton``, which is when Triton reads it.
`interpreted` asks a kernel what it was decorated as, which is what counts once kernels exist
(the environment may have changed since the import).
`round_bf16_like_gpus` makes the interpreter's one float32 → bfloat16 cast round as GPUs do; the
kernels' package applies it on import whenever the interpreter is on, so `verify`, `goldens`,
`serve` and the tests on a CPU all measure the kernels, not the interpreter's rounding.
`patch_language_once_per_launch`, applied the same way, spares the interpreter work it repeats
for nothing at every helper call inside a kernel (the same results, a quarter less time).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
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


class _LanguagePatches:
    """Stands in for the interpreter's ``_patch_lang`` (see `patch_language_once_per_launch`):
    per thread, a stack of the language modules each running launch has patched."""

    def __init__(self, original: Any, empty_scope: Any, language_modules: tuple[object, ...]) -> None:
        self.original = original  # Triton's own, which patches and returns what to restore
        self.empty_scope = empty_scope
        self.language_modules = language_modules
        self.running = threading.local()

    def launches(self) -> list[frozenset[int] | None]:
        if not hasattr(self.running, "launches"):
            self.running.launches = []
        return self.running.launches

    def __call__(self, fn: Any) -> Any:
        launches = self.launches()
        if not launches:  # not inside a launch: Triton's way
            return self.original(fn)
        seen = launches[-1]
        wanted = frozenset(
            id(v) for v in fn.__globals__.values() if any(v is m for m in self.language_modules)
        )
        if seen is not None and wanted <= seen:
            return self.empty_scope()  # nothing new: what this launch patched stands until it ends
        # the launch's own patching, or a helper that sees a module not patched yet in this launch
        # (those of triton.language.standard see triton.language.core too; Triton never restores
        # what a helper call patches, so it stays patched for the launch, as it would without this)
        launches[-1] = wanted if seen is None else seen | wanted
        return self.original(fn)


def patch_language_once_per_launch() -> bool:
    """Triton 3.6's interpreter patches ``triton.language`` for a launch (every builtin swapped for
    its interpreted form, found by ``inspect.getmembers`` over the module) and restores it after.
    It does it again at every call of a ``@triton.jit`` helper inside the kernel, for nothing: the
    helper sees the same module, already patched.  Helpers called per token or per chunk (the
    conv's `_conv_row`, ``tl.sigmoid``) made that a quarter of a CPU `verify` (kernel checks 24.5 s
    with it, 18.5–18.9 s without, the same values).  Make a helper call skip the patching when the
    running launch has patched every language module the helper sees.  Idempotent.  Returns
    False, changing nothing, if the interpreter's internals are not the ones this was written
    against."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    current = getattr(interpreter, "_patch_lang", None)
    empty_scope = getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if isinstance(current, _LanguagePatches):
        return True
    if current is None or empty_scope is None or not isinstance(executor, type):
        return False
    launch: Callable[..., Any] | None = vars(executor).get("__call__")
    if launch is None:
        return False
    patches = _LanguagePatches(current, empty_scope, (tl, tl.core))
    run_launch: Callable[..., Any] = launch

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        launches = patches.launches()
        launches.append(None)  # the launch's own `_patch_lang` call fills it in
        try:
            return run_launch(self, *args, **kwargs)
        finally:
            launches.pop()

    interpreter._patch_lang = patches
    executor.__call__ = call  # type: ignore[method-assign]
    return True
