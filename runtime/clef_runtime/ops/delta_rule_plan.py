"""A chunked delta-rule call's host work done once per input layout ("plans"), for host time.

A chunked call (`delta_rule_chunk.chunk_gated_delta_rule`) checks its inputs, derives its tiles,
allocates its outputs and about ten intermediates and makes two launches (the split design) or
three through Triton's launcher: 160-200 µs of host time a call on the H200's host without
plans, more than the op's GPU time at chunked-prefill sizes (docs/performance.md, "Host time per
chunked call").  Everything but the
allocations and the launches is a function of the inputs' layout (shapes, strides, dtypes, device,
16-byte alignment of each pointer) and the call's flags, so the second call of a layout runs the
plain path and records a `Plan`; every later call of that layout:

1. one workspace for all intermediates and the walk's TMA scratch (`layout`), kept for the
   next call on the same stream up to `KEEP_WORKSPACE_BYTES`, and launch 1 straight away (the
   plain path allocates each intermediate: cheaper than views);
2. one allocation each for the output and the final state (``new_empty`` of an input of the same
   dtype where there is one: it parses fewer arguments than ``torch.empty``);
3. the other launches, each straight into the compiled kernel's launcher
   (`clef_runtime.ops.fast_launch`), its arguments from a tuple built by one generated function
   (input and workspace addresses as integers, every other argument a recorded constant).

The key (`plan_key`) holds every property the input checks, the configuration and Triton's
specialisation read, so a call that finds a plan would have passed the checks and compiled the
same kernels.  The plain path stays for everything else: the interpreter, another Triton, launch
hooks set, inputs that are not tensors, aliased inputs, and the first two calls of a layout (the
second records the plan: a caller whose layouts never repeat pays only the key).
`CLEF_FAST_LAUNCH=0` turns plans off.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Triton's private allocator module: the public `triton.set_allocator` sets the allocator for the
# rest of the context and returns no token, and Triton has no public getter, so it can neither
# put the caller's allocator back after one launch nor tell whether the caller has set one
# (`launch_with_scratch` needs both).  Checked against Triton 3.6 (constraints.txt).
from triton.runtime import _allocation

from clef_runtime.ops import fast_launch

ALIGN = 256  # every intermediate starts at a multiple of this many bytes of the workspace
MAX_PLANS = 256  # layouts kept; the cache is emptied when it would grow past this
# A workspace up to this size is kept for the next call on the same device and stream (one a
# stream, the largest asked for): its intermediates live only within a call, and the next call's
# kernels run after this call's in stream order, the same order that lets the caching allocator
# hand a freed block straight back on that stream.  Saves an allocation a call (2.5-5 µs of host
# time on the H200's hosts).  At Qwen3.5-9B's heads a workspace takes about 8.6 KiB a token (B1
# T8192: 69 MiB; 32768 tokens, in one sequence, four or eight: 276 MiB), so this keeps up to 32K
# tokens' worth; larger ones are allocated per call, so a long prompt does not hold its gigabytes
# after it returns.
KEEP_WORKSPACE_BYTES = 320 << 20
# (device index, stream) → a kept workspace, its size in bytes and its address
_KEPT: dict[tuple[int, int], tuple[torch.Tensor, int, int]] = {}
MAX_KEPT = 8  # streams with a kept workspace; emptied when a ninth would be added

Spec = tuple[tuple[int, ...], torch.dtype]


def layout(specs: Sequence[Spec | None]) -> tuple[int, list[int | None]]:
    """(workspace bytes, each spec's byte offset) for `specs`, each start ALIGN-aligned."""
    off = 0
    offsets: list[int | None] = []
    for spec in specs:
        if spec is None:
            offsets.append(None)
            continue
        shape, dtype = spec
        offsets.append(off)
        off += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return off, offsets


def carve(
    specs: Sequence[Spec | None], device: torch.device, rec: Recorder | None = None
) -> list[torch.Tensor | None]:
    """A tensor for every spec (None where the spec is None).  The plain path allocates each
    (``torch.empty`` is cheaper than a view of one allocation, which takes three tensor ops); a
    recording call also tells `rec` where each one sits in a plan's workspace (`layout`)."""
    views = [None if spec is None else torch.empty(spec[0], dtype=spec[1], device=device) for spec in specs]
    if rec is not None:
        rec.workspace(views, *layout(specs))
    return views


def scratch_allocator(device: torch.device) -> Callable[[int, int, int | None], torch.Tensor]:
    """Triton's allocator (size, alignment, stream) for a launch's global scratch memory (the
    walk's TMA descriptors), on `device` (not whichever device is current)."""

    def scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    return scratch


_SCRATCH: dict[torch.device, Callable[[int, int, int | None], torch.Tensor]] = {}


def launch_with_scratch(device: torch.device, launch: Callable[..., Any], *args: Any) -> Any:
    """`launch(*args)` with `scratch_allocator` set as Triton's allocator, unless the caller has set
    one (a context variable: nothing outside this call sees it)."""
    if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        return launch(*args)
    alloc = _SCRATCH.get(device)
    if alloc is None:
        alloc = _SCRATCH[device] = scratch_allocator(device)
    token = _allocation._allocator.set(alloc)
    try:
        return launch(*args)
    finally:
        _allocation._allocator.reset(token)


# where a plan's pointer arguments come from: the call's inputs and outputs, by position in
# `Recorder.sources`: q, k, v, g, beta, cu_seqlens, initial_state, o, final state
N_INPUTS = 7
O_INDEX, FINAL_INDEX = 7, 8


@dataclass(frozen=True)
class PlannedLaunch:
    recorded: fast_launch.Recorded
    grid: tuple[int, ...]
    # (source addresses, workspace address, stream) → the arguments of the launcher's C function
    # (`direct`), or of `Recorded.launch`'s (grid, stream, args) otherwise
    build: Callable[[Sequence[int], int, int], tuple[Any, ...]]
    c_launch: Callable[..., Any] | None  # the launcher's C function (None: `Recorded.launch`)
    scratch: bool  # not direct and needs Triton's allocator (device-side TMA descriptors)
    uses_outputs: bool


@dataclass(frozen=True)
class Plan:
    """The recorded host work of one input layout (see the module docstring)."""

    o_shape: tuple[int, ...]
    o_dtype: torch.dtype
    final_shape: tuple[int, ...] | None
    ws_bytes: int
    launches: tuple[PlannedLaunch, ...]
    device: torch.device
    # the input (by position in `Recorder.sources`) each allocation is made like (``new_empty``:
    # its dtype and device, and a cheaper call than ``torch.empty``'s), or None: ``torch.empty``
    ws_like: int | None = None  # the workspace, in that input's elements (ws_bytes divides evenly)
    o_like: int | None = None
    final_like: int | None = None
    keep: bool = False  # the workspace is kept between calls (`KEEP_WORKSPACE_BYTES`; CUDA only)
    device_index: int = field(init=False)  # device.index, read once

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_index", self.device.index or 0)

    def __call__(
        self, stream: int, inputs: Sequence[torch.Tensor | None], ptrs: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the plan on `inputs` (in `Recorder.sources` order) whose addresses are `ptrs` (two
        slots at the end for the outputs' addresses) on `stream`."""
        if self.keep and not torch._C._cuda_isCurrentStreamCapturing():
            where = (self.device_index, stream)
            kept = _KEPT.get(where)
            if kept is None or kept[1] < self.ws_bytes:
                if kept is None and len(_KEPT) >= MAX_KEPT:
                    _KEPT.clear()
                ws = self._workspace(inputs)
                kept = _KEPT[where] = (ws, ws.nbytes, ws.data_ptr())
            base = kept[2]
        else:  # a graph's capture takes its memory from the graph's pool: a workspace of its own
            ws = self._workspace(inputs)
            base = ws.data_ptr()
        o: torch.Tensor | None = None
        final = None
        for pl in self.launches:
            if o is None and pl.uses_outputs:
                o, final = self._outputs(inputs, ptrs)
            if pl.c_launch is not None:
                pl.c_launch(*pl.build(ptrs, base, stream))
            elif pl.scratch:
                launch_with_scratch(self.device, pl.recorded.launch, *pl.build(ptrs, base, stream))
            else:
                pl.recorded.launch(*pl.build(ptrs, base, stream))
        if o is None:
            o, final = self._outputs(inputs, ptrs)
        return o, final

    def _workspace(self, inputs: Sequence[torch.Tensor | None]) -> torch.Tensor:
        like = None if self.ws_like is None else inputs[self.ws_like]
        if like is not None:
            return like.new_empty(self.ws_bytes // like.element_size())
        return torch.empty(self.ws_bytes, dtype=torch.uint8, device=self.device)

    def _outputs(
        self, inputs: Sequence[torch.Tensor | None], ptrs: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        like = None if self.o_like is None else inputs[self.o_like]
        if like is not None:
            o = like.new_empty(self.o_shape)
        else:
            o = torch.empty(self.o_shape, dtype=self.o_dtype, device=self.device)
        ptrs[O_INDEX] = o.data_ptr()
        final = None
        if self.final_shape is not None:
            like = None if self.final_like is None else inputs[self.final_like]
            if like is not None:
                final = like.new_empty(self.final_shape)
            else:
                final = torch.empty(self.final_shape, dtype=torch.float32, device=self.device)
            ptrs[FINAL_INDEX] = final.data_ptr()
        return o, final


def _like(
    sources: Sequence[torch.Tensor | None], dtype: torch.dtype, device: torch.device, nbytes: int = 0
) -> int | None:
    """The first input of `dtype` (any dtype whose item size divides `nbytes`, if given) on
    `device`: what a plan allocates like (`Plan`)."""
    for i, t in enumerate(sources[:N_INPUTS]):
        if t is None or t.device != device:
            continue
        if (t.dtype == dtype) if not nbytes else (nbytes % t.element_size() == 0):
            return i
    return None


def _builder(
    rec: fast_launch.Recorded,
    grid: tuple[int, ...],
    recipe: Sequence[tuple[str, Any]],
    scratch_off: int | None,
) -> Callable[[Sequence[int], int, int], tuple[Any, ...]]:
    """A function (source addresses, workspace address, stream) → the arguments of one launch:
    of the launcher's C function where `rec` has one (with the global scratch at workspace
    offset `scratch_off`), else of `Recorded.launch`."""
    consts: list[Any] = []

    def const(value: Any) -> str:
        if type(value) is int or value is None or type(value) is bool:
            return repr(value)  # a literal: cheaper to load than an indexed constant
        consts.append(value)
        return f"c[{len(consts) - 1}]"

    items = []
    for kind, value in recipe:
        if kind == "src":
            items.append(f"p[{int(value)}]")
        elif kind == "ws":
            items.append(f"b + {int(value)}")
        else:
            items.append(const(value))
    g = (*grid, 1, 1)[:3]
    if rec.c_launch is not None:
        scratch = "None" if scratch_off is None else f"b + {int(scratch_off)}"
        head = [str(int(g[0])), str(int(g[1])), str(int(g[2])), "s", const(rec.function)]
        head += [
            const(rec.flags[0]),
            const(rec.flags[1]),
            scratch,
            "None",
            const(rec.packed),
            "None",
            "None",
            "None",
        ]
        tail = const(tuple(rec.tail)) if rec.tail else "()"  # the constexprs: one tuple
        src = "lambda p, b, s, c=c: (" + ", ".join(head + items) + ",) + " + tail
    else:
        src = "lambda p, b, s, c=c: (" + const(tuple(grid)) + ", s, (" + ", ".join(items) + ",))"
    # the source holds only indices, offsets, int/bool/None literals and names of recorded constants
    fn: Callable[[Sequence[int], int, int], tuple[Any, ...]] = eval(src, {"c": consts})
    return fn


class Recorder:
    """Watches the plain path of one call and turns its launches into a `Plan`."""

    def __init__(self, inputs: Sequence[torch.Tensor | None]) -> None:
        self.sources: list[torch.Tensor | None] = list(inputs)
        present = [id(t) for t in inputs if t is not None]
        # an input passed in two roles would be recorded as one of them: no plan from such a call
        self.ok = len(set(present)) == len(present)
        self.ws: dict[int, int] = {}  # id of an intermediate → its offset in the plan's workspace
        self.ws_bytes = -1
        self.launches: list[tuple[fast_launch.Recorded, tuple[int, ...], list[tuple[str, Any]]]] = []
        self._keep: list[torch.Tensor] = []  # the intermediates, alive while their ids are keys

    def workspace(
        self, tensors: Sequence[torch.Tensor | None], total: int, offsets: Sequence[int | None]
    ) -> None:
        if self.ws_bytes >= 0:  # one workspace a call
            self.ok = False
        for t, off in zip(tensors, offsets, strict=True):
            if t is not None and off is not None:
                self.ws[id(t)] = off
                self._keep.append(t)
        self.ws_bytes = total

    def outputs(self, o: torch.Tensor, final: torch.Tensor | None) -> None:
        self.sources += [o, final]

    def _source(self, a: object) -> tuple[str, Any] | None:
        if isinstance(a, torch.Tensor):
            for i, t in enumerate(self.sources):
                if t is a:
                    return ("src", i)
            off = self.ws.get(id(a))
            return None if off is None else ("ws", off)
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return ("const", a)
        return None

    def launch(
        self, kernel: Any, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any],
        scratch: torch.device | None = None,
    ) -> None:  # fmt: skip
        """``kernel[grid](*args, **kwargs)`` (under `launch_with_scratch` on `scratch`, if given),
        recorded."""
        if scratch is not None:
            rec = launch_with_scratch(scratch, fast_launch.record, kernel, grid, args, kwargs)
        else:
            rec = fast_launch.record(kernel, grid, args, kwargs)
        if not self.ok or rec is None:
            self.ok = False
            return
        recipe = [self._source(a) for a in args]
        if any(r is None for r in recipe) or (rec.scratch[0] > 0 and scratch is None):
            self.ok = False
            return
        self.launches.append((rec, tuple(grid), recipe))  # type: ignore[arg-type]

    def plan(self) -> Plan | None:
        if not self.ok or self.ws_bytes < 0 or len(self.sources) != N_INPUTS + 2:
            return None
        o, final = self.sources[O_INDEX], self.sources[FINAL_INDEX]
        assert o is not None
        ws_bytes = self.ws_bytes
        launches = []
        for rec, grid, recipe in self.launches:
            need = rec.scratch_bytes(grid)
            direct = rec.c_launch is not None
            scratch_off = None
            if direct and need > 0:  # the launch's global scratch goes into the workspace too
                align = max(ALIGN, rec.scratch[1])
                scratch_off = -(-ws_bytes // align) * align
                ws_bytes = scratch_off + need
            uses_outputs = any(kind == "src" and i >= N_INPUTS for kind, i in recipe)
            build = _builder(rec, grid, recipe, scratch_off)
            launches.append(
                PlannedLaunch(rec, grid, build, rec.c_launch, not direct and need > 0, uses_outputs)
            )
        device = o.device
        return Plan(
            tuple(o.shape), o.dtype, None if final is None else tuple(final.shape), ws_bytes, tuple(launches),
            device, _like(self.sources, torch.uint8, device, ws_bytes), _like(self.sources, o.dtype, device),
            None if final is None else _like(self.sources, final.dtype, device),
            device.type == "cuda" and ws_bytes <= KEEP_WORKSPACE_BYTES,
        )  # fmt: skip


def plain_launch(
    rec: Recorder | None, kernel: Any, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any],
    scratch: torch.device | None = None,
) -> None:  # fmt: skip
    """``kernel[grid](*args, **kwargs)``, recorded into `rec` when there is one."""
    if rec is not None:
        rec.launch(kernel, grid, args, kwargs, scratch)
    elif scratch is not None:
        launch_with_scratch(scratch, lambda: kernel[grid](*args, **kwargs))
    else:
        kernel[grid](*args, **kwargs)


def tensor_key(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    """What the checks read of one tensor argument (Triton's specialisation also reads its
    address's alignment: the caller keys that)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.get_device())
