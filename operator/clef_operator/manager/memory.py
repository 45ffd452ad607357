"""Keeping the operator's resident memory to what it holds (glibc's malloc, through ctypes; a no-op
on any other C library).

* `limit_arenas`: glibc gives each thread that allocates its own arena (up to 8 per CPU), and each
  keeps the high-water mark of what its thread once used.  The operator's threads (reconciles,
  watches, event posters) allocate briefly and often, so a few shared arenas are enough.  Called at
  start-up, before any thread starts.
* `trim`: after a burst of work (start-up, models rolled out, models deleted) `malloc_trim`
  hands the freed pages back to the system, so RSS falls with the number of models instead of
  staying at its peak; `touched` marks the work and a `Trimmer` thread trims once it is quiet.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import itertools
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

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


TUNABLES_ENV = "GLIBC_TUNABLES"
NO_THREAD_CACHE = "glibc.malloc.tcache_count=0"


def without_thread_caches() -> None:
    """Re-execute the process once with glibc's per-thread caches off, unless the environment
    already says how many blocks they keep.  glibc keeps freed small blocks (up to 7 of each size
    up to 1 KiB) in a cache per thread, which counts as in use: no trim returns it, and each of the
    operator's ~37 threads keeps its cache filled by the last burst of work (30 threads that
    allocated and went idle kept 5 MiB; 0.5 MiB without the caches).  The cache can only be
    switched off when the process starts (a tunable), hence the re-execution; a no-op on any other
    C library.  Call it first, before any thread starts or anything is written."""
    if _LIBC is None or not hasattr(_LIBC, "gnu_get_libc_version"):
        return
    current = os.environ.get(TUNABLES_ENV, "")
    if "glibc.malloc.tcache_count=" in current:
        return
    env = {**os.environ, TUNABLES_ENV: f"{current}:{NO_THREAD_CACHE}" if current else NO_THREAD_CACHE}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


# Memory is handed back this long after the last sign of work, at most once per TRIM_EVERY_SECONDS.
TRIM_AFTER_SECONDS = 5.0
TRIM_EVERY_SECONDS = 30.0


class Trimmer(threading.Thread):
    """Hands freed memory back after a burst of work (`trim`), from a thread of its own: `touched`
    marks work done (a pass ended, the work queue forgot a deleted model, the cache dropped
    objects or listed);
    once nothing was touched for `quiet` seconds, and at most every `every` seconds, it trims,
    with a collection first if any touch asked for one.  So RSS falls after a rollout of many
    models, after their deletion (the children the cache drops after the models were forgotten
    too), and after start-up, not only after passes."""

    def __init__(
        self,
        quiet: float = TRIM_AFTER_SECONDS,
        every: float = TRIM_EVERY_SECONDS,
        trims: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__(name="memory-trim", daemon=True)
        self.quiet, self.every = quiet, every
        # What a trim does (`trim`; a test passes its own, so the process's trimmer cannot reach it).
        self._trim: Callable[[bool], None] = trims or (lambda collect: trim(collect))
        self._lock = threading.Lock()
        self._touched = threading.Event()
        self._last = 0.0
        self._collect = False
        self.trims = 0

    def touched(self, collect: bool = False) -> None:
        with self._lock:
            self._last = time.monotonic()
            self._collect = self._collect or collect
            self._touched.set()

    def run(self) -> None:
        trimmed_at = -self.every
        while True:
            self._touched.wait()
            while True:
                with self._lock:
                    due = max(self._last + self.quiet, trimmed_at + self.every)
                    if time.monotonic() >= due:
                        collect, self._collect = self._collect, False
                        self._touched.clear()
                        break
                time.sleep(max(due - time.monotonic(), 0.05))
            self._trim(collect)
            trimmed_at = time.monotonic()
            self.trims += 1


_TRIMMER: Trimmer | None = None
_TRIMMER_LOCK = threading.Lock()


def touched(collect: bool = False) -> None:
    """Work was done that left memory free (see `Trimmer`); starts the trimmer on first use."""
    global _TRIMMER
    with _TRIMMER_LOCK:
        if _TRIMMER is None:
            _TRIMMER = Trimmer()
            _TRIMMER.start()
    _TRIMMER.touched(collect)


_ON_QUIET: list[Callable[[], object]] = []


def on_quiet(release: Callable[[], object]) -> None:
    """`release` runs before each trim (work has gone quiet): it lets go of what a burst of work
    kept and no longer needs (the client's idle connections), so that a trim returns that too."""
    _ON_QUIET.append(release)


def trim(collect: bool = False) -> None:
    """Return free heap pages to the system, after the `on_quiet` releases; with `collect`, first
    free the cycles a deleted model left, which the collector's oldest
    generation would otherwise keep for long.  A full collection holds the interpreter while it
    walks every object, so it is asked for only after deletions; ctypes lets go of the lock
    during malloc_trim, so nothing waits for that."""
    for release in list(_ON_QUIET):
        try:
            release()
        except Exception:  # a release is an economy; it must never stop the trims
            log.exception("releasing before a trim failed")
    if collect:
        gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


# ------------------------------------------------------------------------------ measuring
# `CLEF_MEMORY_REPORT=FILE clef-operator run ...`: each SIGUSR1 appends a breakdown of the
# process's memory to FILE (docs/performance.md, "Where the memory is").  With CLEF_MEMORY_TRACE=N
# as well (tracemalloc from start-up on, N frames; `N@report`: from the first report on), the
# Python allocations by package and line, and the collector's objects by where they were allocated
# (tracing costs memory and time: measure RSS without it).  Off by default: nothing is installed unless the variable is set.
REPORT_ENV = "CLEF_MEMORY_REPORT"
_REPORTS = itertools.count()
TRACE_ENV = "CLEF_MEMORY_TRACE"
MAX_TRACE_FRAMES = 65535  # tracemalloc's own limit
TRACE_FORMS = (
    f"N or N@report, N a number of frames from 1 to {MAX_TRACE_FRAMES} (unset, empty or 0: no tracing)"
)


def parse_trace(value: str | None) -> tuple[int, bool]:
    """`CLEF_MEMORY_TRACE`'s value as (frames, from the first report on): "N" traces N frames
    from start-up on; "N@report" from the first report on (start-up untraced: tracing slows the
    interpreter ~10x, and what a burst of work leaves is what was born after it); unset, empty or
    "0": (0, False), no tracing.  Anything else is a ValueError that names the variable, the value
    and the forms it takes."""
    if not value:
        return 0, False
    frames_text, at, when = value.partition("@")
    frames = int(frames_text) if frames_text.isascii() and frames_text.isdigit() else -1
    if frames == 0 and not at:
        return 0, False
    if not 1 <= frames <= MAX_TRACE_FRAMES or (at and when != "report"):
        raise ValueError(f"{TRACE_ENV}={value!r}: expected {TRACE_FORMS}")
    return frames, bool(at)


def _smaps() -> dict[str, int]:
    """Resident KiB by mapping class: heap (brk), anonymous (mmap'd: malloc arenas, big blocks,
    thread stacks' touched pages), stacks (the main one), files (shared libraries, by name)."""
    sizes: dict[str, int] = {}
    name = "?"
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                parts = line.split()
                path = parts[5] if len(parts) > 5 else ""
                name = (
                    path
                    if path.startswith("[")
                    else ("anonymous" if not path else "file " + path.rsplit("/", 1)[-1])
                )
            elif head == "Rss:":
                sizes[name] = sizes.get(name, 0) + int(line.split()[1])
    return sizes


def pymalloc_stats() -> list[str]:
    """Python's small-object allocator (`sys._debugmallocstats`, which writes to the C stderr):
    arenas held against the bytes their live blocks use.  Arenas hold what pymalloc cannot hand
    back (an arena with one live block stays)."""
    import tempfile

    with tempfile.TemporaryFile(mode="w+") as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    keep = ("# arenas", "arenas *", "# bytes in", "unused pools", "# bytes lost to quant")
    return ["pymalloc: " + ln.strip() for ln in text.splitlines() if any(k in ln for k in keep)]


def malloc_stats() -> list[str]:
    """glibc's view (`malloc_info`): per arena, the bytes it holds from the system and the free
    bytes in its bins (what a trim could return only where whole pages are free)."""
    import re
    import tempfile

    if _LIBC is None or not hasattr(_LIBC, "malloc_info"):
        return ["malloc_info: not glibc"]
    libc = _LIBC
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(mode="r") as out:
        fp = libc.fopen(out.name.encode(), b"w")
        if not fp:
            return ["malloc_info: fopen failed"]
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        xml = out.read()
    lines = []
    for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', xml, re.S):
        system = re.search(r'<system type="current" size="(\d+)"', body)
        free = sum(int(n) for n in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"', body))
        held = int(system.group(1)) if system else 0
        lines.append(f"malloc arena {nr}: system {held / 2**20:.1f} MiB, free in bins {free / 2**20:.1f} MiB")
    mmap = re.search(r'<total type="mmap" count="(\d+)" size="(\d+)"', xml[xml.rfind("</heap>") :])
    if mmap:
        lines.append(f"malloc mmap'd blocks: {mmap.group(1)}, {int(mmap.group(2)) / 2**20:.1f} MiB")
    return lines


def _mappings() -> list[str]:
    """RSS by kind of mapping (smaps_rollup, then smaps by class and the largest files)."""
    with open("/proc/self/smaps_rollup") as f:
        kept = ("Rss:", "Anonymous:", "Private_Dirty:", "Shared_Clean:", "Private_Clean:")
        lines = [ln.rstrip() for ln in f if ln.split()[0] in kept]
    sizes = _smaps()
    files = sum(v for k, v in sizes.items() if k.startswith("file "))
    lines.append(
        f"smaps Rss KiB: heap {sizes.get('[heap]', 0)} anonymous {sizes.get('anonymous', 0)} "
        f"stack {sizes.get('[stack]', 0)} files {files}"
    )
    return lines + [f"  {k}: {v}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:15]]


def _objects() -> list[str]:
    """Threads by name, the collector's view: gc-tracked objects by type."""

    threads = threading.enumerate()
    trims = _TRIMMER.trims if _TRIMMER is not None else 0
    lines = [
        f"threads: {len(threads)} (os: {len(os.listdir('/proc/self/task'))}): "
        + repr(Counter(t.name.rstrip("0123456789_-") for t in threads).most_common()),
        f"allocated blocks: {sys.getallocatedblocks()}; gc counts {gc.get_count()}; trims {trims}",
    ]
    objects = gc.get_objects()
    lines.append(f"gc-tracked objects: {len(objects)}")
    lines += [f"  {n:8d} {t}" for t, n in Counter(type(o).__qualname__ for o in objects).most_common(25)]
    return lines


def _traced() -> list[str]:
    """With tracemalloc on: the traced total, by package and by line, and the snapshot in a file
    next to the report's (`Snapshot.load(a).compare_to(Snapshot.load(b), "lineno")`: what grew)."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return []
    # Read before the snapshot, whose copy of every trace is itself tens of MiB.
    current, peak = tracemalloc.get_traced_memory()
    snap = tracemalloc.take_snapshot()
    tracemalloc.reset_peak()  # the next report's peak: since this one
    lines = [f"tracemalloc: current {current / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB"]
    report_path = os.environ.get(REPORT_ENV)
    if report_path:
        stamp = time.strftime("%H%M%S") + f".{next(_REPORTS)}"
        snap.dump(f"{report_path}.{stamp}.snap")
        lines.append(f"tracemalloc snapshot: {report_path}.{stamp}.snap")
        with open(f"{report_path}.{stamp}.objects", "w") as f:
            f.writelines(f"{n}\t{where}\n" for where, n in objects_by_origin().most_common())
        lines.append(f"gc-tracked objects by where they were allocated: {report_path}.{stamp}.objects")
    by_package: Counter[str] = Counter()
    marker = "site-packages/"
    for stat in snap.statistics("filename"):
        path = stat.traceback[0].filename
        inside = path.split(marker, 1)[1].split("/", 1)[0] if marker in path else ""
        by_package[inside or os.path.dirname(path) or path] += stat.size
    lines += [f"  {size / 2**20:7.2f} MiB {p}" for p, size in by_package.most_common(15)]
    return lines + [
        f"  {s.size / 2**20:7.2f} MiB {s.count:7d} {s.traceback[0]}" for s in snap.statistics("lineno")[:30]
    ]


def objects_by_origin() -> Counter[str]:
    """With tracemalloc on: the collector's objects counted by type and by where they were
    allocated (the traceback, innermost frame first).  Two reports' counts compared show what a
    burst of work left behind and which code made it (objects born before tracing: "untraced"; an
    object reused from the interpreter's free lists counts where its memory was first allocated)."""
    import tracemalloc

    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        tb = tracemalloc.get_object_traceback(obj)
        where = (
            " < ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(tb))
            if tb
            else "untraced"
        )
        counts[f"{type(obj).__qualname__} @ {where}"] += 1
    return counts


def report() -> str:
    """Where the process's memory is: by mapping, by allocator, by object type, and (traced) by
    line (docs/performance.md, "Where the memory is")."""
    lines = [
        f"--- memory report, pid {os.getpid()}, {time.strftime('%H:%M:%S')}",
        f"{TUNABLES_ENV}={os.environ.get(TUNABLES_ENV, '')}",
    ]
    lines += _mappings() + pymalloc_stats() + malloc_stats() + _objects() + _traced()
    touched()  # what this report allocated (MiB, with tracing) is handed back like any work's
    return "\n".join(lines) + "\n"


def install_report() -> None:
    """With CLEF_MEMORY_REPORT set, SIGUSR1 appends `report()` to that file (and CLEF_MEMORY_TRACE
    turns tracemalloc on: `parse_trace`).  A CLEF_MEMORY_TRACE that is not of that form ends the
    process at start-up, saying so, before anything is installed."""
    import signal
    import tracemalloc

    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        frames, late = parse_trace(os.environ.get(TRACE_ENV))
    except ValueError as e:
        raise SystemExit(f"clef-operator: {e}") from None

    busy = threading.Lock()

    def on_signal(*_: Any) -> None:
        if not busy.acquire(blocking=False):  # a signal during a report: that report will do
            return
        try:
            text = report()
        except Exception as e:  # a measurement must never end the operator
            text = f"--- memory report failed: {e!r}\n"
        finally:
            busy.release()
        with open(path, "a") as f:
            f.write(text)
        if late and not tracemalloc.is_tracing():
            tracemalloc.start(frames)

    signal.signal(signal.SIGUSR1, on_signal)
    if frames and not late:
        tracemalloc.start(frames)
