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
        yield url
    finally:
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
