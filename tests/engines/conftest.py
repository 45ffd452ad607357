"""The real-engine tier (`make test-engines`): real vLLM (its CPU build) and real mistral.rs
0.8.1 asked by `clef-runtime endpoint-check` against goldens from the decisive checkpoint
(`clef_devcluster.decisive`).  Opt-in, not part of `make test`: the engines take a ~6 GB venv and a
~25 min Rust build (both cached under ~/.cache/clef by hack/engines/), and each start takes minutes.

Without CLEF_ENGINES=1 every test here is skipped with the reason printed.  With it, a missing
engine is a failure, not a skip: the tier was asked for (`make test-engines` builds them first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import opt_in

HERE = Path(__file__).parent
REPO = HERE.parents[1]
SKIP_REASON = (
    "real-engine tier is opt-in: set CLEF_ENGINES=1 (`make test-engines` does, after building "
    "vLLM's CPU venv and mistral.rs 0.8.1 into ~/.cache/clef)"
)


def enabled() -> bool:
    return opt_in.enabled("CLEF_ENGINES")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    opt_in.gate(items, HERE, "CLEF_ENGINES", SKIP_REASON)


def cached(script: str) -> Path:
    """The cache directory a hack/engines script builds into; fails (the tier was asked for) when
    it is not built."""
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "engines" / script), "--print-dir"], capture_output=True, text=True
    )
    where = Path(proc.stdout.strip())
    if proc.returncode != 0:
        pytest.fail(f"{script}: {where} is not built: run `make engines` (or the script) first")
    return where


def _group_rss(pgid: int) -> int:
    """Resident bytes of every process in process group `pgid` (the engine and its workers)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += int((stat.parent / "statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue  # the process ended while it was read
    return total


class PeakRss:
    """The highest sum of resident memory over an engine's process group, sampled every 0.5 s on
    a thread until stopped (what the tier reports as the engine's memory)."""

    def __init__(self, pgid: int) -> None:
        self.pgid, self.peak = pgid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, _group_rss(self.pgid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@contextmanager
def engine(cmd: list[str], port: int, log: Path, *, env: dict[str, str] | None = None,
           start_timeout: float = 420) -> Iterator[str]:  # fmt: skip
    """Run a real engine's server until GET /v1/models answers; yield its base URL; stop it with
    SIGTERM (its process group) afterwards."""
    import httpx

    out = log.open("w")
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    rss = PeakRss(proc.pid)
    started = time.monotonic()
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{cmd[0]} exited {proc.returncode}: {log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{cmd[0]} did not answer in {start_timeout}s: {log.read_text()[-4000:]}"
                )
            try:
                if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            # An HTTP server sends no event when it starts listening: ask every 2 s (a start takes
            # 45-125 s; the deadline above bounds it).
            time.sleep(2)
        print(
            f"\n{Path(cmd[0]).name} {' '.join(cmd[1:3])}: answering after {time.monotonic() - started:.0f}s"
        )
        yield url
    finally:
        print(
            f"\n{Path(cmd[0]).name} {' '.join(cmd[1:3])}: peak resident memory {rss.stop() / 2**30:.2f} GiB"
        )
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.close()


def endpoint_check(goldens: Path, url: str, dialect: str, tmp: Path, *args: str) -> tuple[int, dict]:
    """`clef-runtime endpoint-check`: (exit code, full report)."""
    report = tmp / f"report-{dialect}-{time.monotonic_ns()}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "endpoint-check", "--goldens", str(goldens), "--url", url,
         "--dialect", dialect, "--report", str(report), "--termination-log", str(tmp / "termination"),
         "--timeout", "600", *args],
        capture_output=True, text=True, cwd=REPO, timeout=3600,
    )  # fmt: skip
    assert report.is_file(), f"endpoint-check wrote no report (exit {proc.returncode}): {proc.stderr[-3000:]}"
    return proc.returncode, json.loads(report.read_text())
