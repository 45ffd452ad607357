"""memory: freed memory is handed back once work has gone quiet, never during a burst (Trimmer);
the memory report and its CLEF_MEMORY_TRACE setting."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clef_operator.manager import memory


def _wait(probe: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.01)
    return False


def test_a_trim_follows_the_last_touch_once_quiet_and_collects_when_asked() -> None:
    calls: list[tuple[float, bool]] = []
    trimmer = memory.Trimmer(
        quiet=1.0, every=0.0, trims=lambda collect: calls.append((time.monotonic(), collect))
    )
    trimmer.start()
    trimmer.touched(collect=True)
    for _ in range(5):  # a burst: each touch pushes the trim back
        time.sleep(0.1)
        last = (
            time.monotonic()
        )  # (before the touch: the trim is due 1 s after the touch; a wide margin over the 0.1 s gaps)
        trimmer.touched()
    assert _wait(lambda: len(calls) == 1), "no trim after the burst"
    at, collect = calls[0]
    assert at >= last + 1.0, "trimmed during the burst"
    assert collect, "a touch in the burst asked for a collection"
    trimmer.touched()
    assert _wait(lambda: len(calls) == 2)
    assert calls[1][1] is False, "the collection was asked for once, not for ever"


def test_trims_are_spaced_by_every() -> None:
    calls: list[float] = []
    trimmer = memory.Trimmer(quiet=0.0, every=0.5, trims=lambda collect: calls.append(time.monotonic()))
    trimmer.start()
    trimmer.touched()
    assert _wait(lambda: len(calls) == 1)
    trimmer.touched()
    assert _wait(lambda: len(calls) == 2)
    assert calls[1] - calls[0] >= 0.5


def test_the_report_says_what_each_allocator_holds() -> None:
    """pymalloc's arenas against its blocks in use, glibc's arenas against the free bytes in their
    bins: where RSS that no Python object accounts for is (docs/performance.md)."""
    import sys

    pymalloc = memory.pymalloc_stats()
    if sys.flags.dev_mode or not pymalloc:  # PYTHONMALLOC=malloc: pymalloc is not in use
        assert pymalloc == []
    else:
        assert any("arenas allocated current" in line for line in pymalloc), pymalloc
        assert any("bytes in allocated blocks" in line for line in pymalloc), pymalloc
    glibc = memory.malloc_stats()
    if memory._LIBC is None:
        assert glibc == ["malloc_info: not glibc"]
    else:
        assert glibc[0].startswith("malloc arena 0: system "), glibc


def test_releases_run_before_each_trim_and_a_failing_one_stops_none() -> None:
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("a release that fails")

    memory.on_quiet(failing)
    memory.on_quiet(lambda: ran.append("second"))
    try:
        memory.trim()
    finally:
        del memory._ON_QUIET[-2:]
    assert ran == ["failing", "second"]


def test_objects_are_counted_by_where_they_were_allocated() -> None:
    """With tracing on, the collector's objects by type and allocating line: two reports compared
    show what a burst left behind and which code made it."""
    import tracemalloc

    def make() -> list[dict[str, list[int]]]:
        return [{"kept": [i]} for i in range(300)]

    # Empty the interpreter's free lists first (taking what they hold, and keeping it), so that
    # the objects made below are new allocations, traced where they are made: how many a free
    # list holds depends on what ran before in this process.
    drained = [([], {}) for _ in range(1000)]
    tracemalloc.start(4)
    try:
        kept = make()
        counts = memory.objects_by_origin()
    finally:
        tracemalloc.stop()
    line = make.__code__.co_firstlineno + 1
    born = {where: n for where, n in counts.items() if f"test_memory.py:{line}" in where.split(" < ")[0]}
    # An object reused from the interpreter's free lists counts where its memory was first
    # allocated (untraced here); drained above, but allow what the test's own frames may return.
    del drained
    assert len(kept) - 80 <= sum(n for where, n in born.items() if where.startswith("dict @")) <= len(kept)
    assert (
        len(kept) - 80 <= sum(n for where, n in born.items() if where.startswith("list @")) <= len(kept) + 1
    )


def test_the_operator_runs_without_glibcs_thread_caches_unless_told_otherwise() -> None:
    """`without_thread_caches` re-executes the process once with the tunable set; a tcache_count
    the environment already names is kept (and nothing is re-executed)."""
    import os
    import subprocess
    import sys

    if memory._LIBC is None or not hasattr(memory._LIBC, "gnu_get_libc_version"):
        pytest.skip(
            "skip: this Python does not run on glibc, so there is no per-thread cache to switch off; "
            "run it on a glibc Linux (the operator's image is one)"
        )
    probe = (
        "import os; print(os.getpid(), os.environ.get('GLIBC_TUNABLES'), flush=True); "
        "from clef_operator.manager import memory; memory.without_thread_caches(); print('after')"
    )
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    (pid, before), (same, now), after = [ln.split() for ln in out.stdout.splitlines()]
    assert (before, now, after) == ("None", memory.NO_THREAD_CACHE, ["after"]), out.stdout
    assert pid == same, "re-executed in place (the same process)"
    kept = {**env, "GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}
    out = subprocess.run([sys.executable, "-c", probe], env=kept, capture_output=True, text=True, check=True)
    assert out.stdout.split()[1:] == ["glibc.malloc.tcache_count=7", "after"], out.stdout


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (0, False)),
        ("", (0, False)),
        ("0", (0, False)),
        ("12", (12, False)),
        ("12@report", (12, True)),
        ("1", (1, False)),
        ("65535@report", (65535, True)),
    ],
)
def test_the_trace_setting_takes_its_documented_forms(value: str | None, expected: tuple[int, bool]) -> None:
    assert memory.parse_trace(value) == expected


@pytest.mark.parametrize(
    "value", ["twelve", "12@start", "12@", "@report", "0@report", "-3", "65536", "1.5", "12 ", "١٢"]
)
def test_a_trace_setting_of_another_form_is_refused_naming_the_variable_the_value_and_the_forms(
    value: str,
) -> None:
    with pytest.raises(ValueError) as refused:
        memory.parse_trace(value)
    assert str(refused.value) == (
        f"CLEF_MEMORY_TRACE={value!r}: expected N or N@report, N a number of frames from 1 to 65535"
        " (unset, empty or 0: no tracing)"
    )


@pytest.mark.parametrize("value", ["twelve", "12@start"])
def test_the_operator_refuses_to_start_with_a_trace_setting_of_another_form(
    value: str, tmp_path: Path
) -> None:
    """`clef-operator run` stops at once with one line naming the variable, the value and its
    forms (not a bare int() traceback, not a silently untraced run), before it reaches the cluster."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CLEF_MEMORY_REPORT": str(tmp_path / "mem.txt"), "CLEF_MEMORY_TRACE": value}
    env["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    out = subprocess.run(
        [sys.executable, "-m", "clef_operator.cli", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert out.stderr.strip().splitlines() == [
        f"clef-operator: CLEF_MEMORY_TRACE={value!r}: expected N or N@report, N a number of frames"
        " from 1 to 65535 (unset, empty or 0: no tracing)"
    ], out.stderr
