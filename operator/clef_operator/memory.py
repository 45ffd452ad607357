"""Keeping the operator's resident memory to what it holds (glibc's malloc, through ctypes; a no-op
on any other C library).

* `limit_arenas`: glibc gives each thread that allocates its own arena (up to 8 per CPU), and each
  keeps the high-water mark of what its thread once used.  The operator's threads (reconciles,
  watches, event posters) allocate briefly and often, so a few shared arenas are enough.  Called at
  start-up, before any thread starts.
* `trim`: after a burst of work (models rolled out, models deleted) `malloc_trim` hands the freed
  pages back to the system, so RSS falls with the number of models instead of staying at its
  peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("clef.memory")

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
ARENAS = 2


def _find_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")  # runs ldconfig: once, at import
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


_LIBC = _find_libc()


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` malloc arenas for the process; whether the C library took it."""
    return bool(_LIBC is not None and _LIBC.mallopt(M_ARENA_MAX, arenas) == 1)


def trim(collect: bool = False) -> None:
    """Return free heap pages to the system; with `collect`, first free the cycles a deleted
    model left (kopf's per-object tasks and loggers hold some), which the collector's oldest
    generation would otherwise keep for long.  A full collection holds the interpreter while it
    walks every object, so it is asked for only after deletions; ctypes lets go of the lock
    during malloc_trim, so nothing waits for that."""
    if collect:
        gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
