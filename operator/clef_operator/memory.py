"""Keeping the operator's resident memory to what it holds (glibc's malloc, through ctypes; a no-op
on any other C library).

* `limit_arenas`: glibc gives each thread that allocates its own arena (up to 8 per CPU), and each
  keeps the high-water mark of what its thread once used.  The operator's threads (reconciles,
  watches, event posters) allocate briefly and often, so a few shared arenas are enough.  Called at
  start-up, before any thread starts.
* `trim`: after models are deleted, a collection and `malloc_trim` hand the freed pages back to
  the system, so RSS falls with the number of models instead of staying at its peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("clef.memory")

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` malloc arenas for the process; whether the C library took it."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> None:
    """Collect cycles, then return free heap pages to the system."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
