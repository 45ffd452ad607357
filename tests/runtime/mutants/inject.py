"""Running a kernel-source mutant: the op module's mutated source is written to a file of its own
and imported as a fresh module (Triton's interpreter, like its compiler, reads a kernel's source
from its file through `inspect`, so a string `exec` would not do: a function without a file is run
unrewritten).  The mutated @triton.jit function then replaces the original object wherever a loaded
`clef_runtime` module holds it (the op's own module, and every module that imported it by name,
such as the kernels that call a helper), so the real op functions launch the mutant.  Everything is
put back on exit.

Interpreter only: a compiled kernel caches its callees' code, so a replaced helper would not reach
an already compiled caller on a GPU."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from clef_runtime.interpreter import interpreting

from .source import Mutant, mutate

_COUNTER = itertools.count()
_DIR = Path(tempfile.mkdtemp(prefix="clef-mutants-"))


def load_mutated(mutant: Mutant) -> ModuleType:
    """A fresh module built from the mutated source of `mutant.module`."""
    original = importlib.import_module(mutant.module)
    assert original.__file__ is not None
    source = mutate(Path(original.__file__).read_text(), mutant)
    stem = mutant.module.rsplit(".", 1)[-1]
    n = next(_COUNTER)
    path = _DIR / f"{stem}_mutant_{n}.py"  # a new name each time: linecache never serves old text
    path.write_text(source)
    name = f"{mutant.module}_mutant_{n}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the body runs
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    return mod


@contextmanager
def injected(mutant: Mutant) -> Iterator[int]:
    """While active, every loaded `clef_runtime` module that held the original @triton.jit function
    holds the mutated one.  Yields how many references were replaced (at least one)."""
    if not interpreting():
        raise RuntimeError("source mutants run under the Triton interpreter only (TRITON_INTERPRET=1)")
    original = getattr(importlib.import_module(mutant.module), mutant.function)
    replacement = getattr(load_mutated(mutant), mutant.function)
    swapped: list[tuple[ModuleType, str]] = []
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("clef_runtime"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, replacement)
                swapped.append((mod, attr))
    try:
        yield len(swapped)
    finally:
        for mod, attr in swapped:
            setattr(mod, attr, original)
