"""Launching an already compiled Triton kernel without Triton's per-call Python launcher.

``kernel[grid](*args, **kwargs)`` (Triton 3.6's ``JITFunction.run``) binds every argument,
specialises each one in C++, turns the specialisation and the options into a cache key, looks the
compiled kernel up, checks the kernel's globals, builds the launch metadata for the (empty) launch
hooks and only then calls the compiled kernel's C launcher, which asks the driver about every
tensor pointer.  On the H200's host that is tens of µs a launch (docs/performance.md, "Host time
per chunked call").  A caller that knows the specialisation is the same as on an earlier launch
(it keys its own cache on everything Triton specialises on) can call the launcher directly:

* `record` runs one launch the plain way and keeps what a direct launch needs: the compiled
  kernel's launcher, its function handle, its packed metadata and the values of its
  constexpr parameters (which the launcher takes positionally and ignores);
* `Recorded.launch` then calls that launcher with the runtime arguments (pointers may be plain
  integers: the launcher reads ``data_ptr()`` of a tensor, an integer as the address itself).

It is used only where `supported` says so: Triton 3.6 (the version whose internals this was
written against), not the interpreter, and no launch hooks set (a profiler's hooks get the plain
path).  Anywhere else `record` returns None and callers launch the plain way.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from clef_runtime.interpreter import interpreted

# Triton versions whose JITFunction / CompiledKernel / launcher internals this module was checked
# against (a prefix of triton.__version__).
KNOWN_TRITON = ("3.6.",)
# CLEF_FAST_LAUNCH=0 turns the direct launches off (every launch then goes through kernel[grid]).
ENV_VAR = "CLEF_FAST_LAUNCH"
ENABLED = os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no")


@functools.lru_cache(maxsize=1)
def _internals() -> tuple[Any, Any] | None:
    """(Triton's runtime knobs, its active driver) where this Triton is one `KNOWN_TRITON` names
    and has the attributes used here; None otherwise."""
    if not triton.__version__.startswith(KNOWN_TRITON):
        return None
    try:
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    hooks = (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None))
    if not all(hasattr(h, "calls") for h in hooks):
        return None
    if not all(hasattr(JITFunction, a) for a in ("run", "__getitem__")):
        return None
    if not all(hasattr(CompiledKernel, a) for a in ("run", "launch_metadata")):
        return None
    return runtime, driver


def supported(kernel: object) -> bool:
    """Whether a direct launch of `kernel` may be used now: switched on, a known Triton, a
    compiled (not interpreted) kernel, and no launch hooks registered."""
    if not ENABLED or interpreted(kernel):
        return False
    internals = _internals()
    if internals is None:
        return False
    runtime = internals[0]
    return not (runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


@functools.lru_cache(maxsize=1)
def _device_and_stream_getters() -> tuple[Callable[[], int], Callable[[int], int]]:
    internals = _internals()
    assert internals is not None
    drv = internals[1].active
    get_device = drv.get_current_device
    if get_device is torch.cuda.current_device:
        # what it returns once CUDA is initialised (a caller holding a CUDA tensor), without its
        # Python wrapper's initialisation check
        get_device = torch._C._cuda_getDevice
    return get_device, drv.get_current_stream


def current_stream() -> tuple[int, int]:
    """(current device index, its current stream's handle), as Triton's launch reads them."""
    get_device, get_stream = _device_and_stream_getters()
    device = get_device()
    return device, get_stream(device)


@dataclass(frozen=True)
class Recorded:
    """What a direct launch of one compiled kernel needs (see the module docstring)."""

    name: str
    run: Callable[..., Any]  # the compiled kernel's launcher (CudaLauncher)
    function: int  # the CUfunction handle
    packed: Any  # packed metadata (warps, CTAs, shared memory)
    n_args: int  # runtime (non-constexpr) parameters, all leading
    tail: tuple[Any, ...]  # the constexpr parameters' values, in signature order
    # the launcher's C function, where it can be called without its Python wrapper: no profile
    # scratch, the flags the wrapper passes, and the global scratch it would allocate
    # (bytes a program, alignment), which the caller then provides (None: call `run`)
    c_launch: Callable[..., Any] | None
    flags: tuple[Any, Any]  # (launch_cooperative_grid, launch_pdl)
    scratch: tuple[int, int]

    def launch(self, grid: Sequence[int], stream: int, args: Sequence[Any]) -> None:
        """Launch on `stream` with the runtime arguments `args` (in signature order) through the
        launcher's Python wrapper (which allocates any global scratch through Triton's allocator)."""
        self.run(
            grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            stream, self.function, self.packed, None, None, None, *args, *self.tail,
        )  # fmt: skip

    def scratch_bytes(self, grid: Sequence[int]) -> int:
        """Global scratch a launch of `grid` needs (0: none)."""
        return math.prod(grid) * self.scratch[0] * (self.packed[1] if len(self.packed) > 1 else 1)


def record(kernel: Any, grid: Sequence[int], args: Sequence[Any], kwargs: dict[str, Any]) -> Recorded | None:
    """``kernel[grid](*args, **kwargs)``; returns what launching the same specialisation directly
    needs, or None where `supported` says no or the call is not of the form this handles (runtime
    arguments positional and first in the signature, constexprs by keyword after them)."""
    compiled = kernel[tuple(grid)](*args, **kwargs)
    if compiled is None or not supported(kernel):
        return None
    params = getattr(kernel, "params", None)
    if params is None:
        return None
    n = len(args)
    if any(p.is_constexpr for p in params[:n]) or not all(p.is_constexpr for p in params[n:]):
        return None
    tail = []
    for p in params[n:]:
        if p.name in kwargs:
            tail.append(kwargs[p.name])
        elif p.has_default:
            tail.append(p.default)
        else:  # pragma: no cover - Triton would have raised
            return None
    run = compiled.run  # creates the launcher and loads the module if needed
    function = compiled.function
    if function is None:
        return None
    c_launch = getattr(run, "launch", None)
    attrs = ("launch_cooperative_grid", "launch_pdl", "global_scratch_size", "global_scratch_align")
    if (
        type(run).__name__ != "CudaLauncher"
        or not callable(c_launch)
        or getattr(run, "profile_scratch_size", 1) != 0
        or not all(hasattr(run, a) for a in attrs)
        or getattr(run, "num_ctas", 1) != 1
    ):
        c_launch = None
    return Recorded(
        compiled.name, run, function, compiled.packed_metadata, n, tuple(tail), c_launch,
        (getattr(run, "launch_cooperative_grid", None), getattr(run, "launch_pdl", None)),
        (int(getattr(run, "global_scratch_size", 0) or 0), int(getattr(run, "global_scratch_align", 1) or 1)),
    )  # fmt: skip
