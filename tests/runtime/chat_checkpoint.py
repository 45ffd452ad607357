"""The endpoint tests' shared pieces: the small chat checkpoint (written by
`clef_devcluster.checkpoints`, which the local cluster's serve images load too), the goldens the
tests share, made once per test session by the real command (`clef-runtime goldens`, Triton op
set: its kernels suite runs first), a served checkpoint, and `endpoint-check`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clef_devcluster.checkpoints import (  # noqa: F401  (re-exported for the tests)
    OTHER_TEMPLATE,
    TEMPLATE,
    VOCAB,
    write_chat_checkpoint,
    write_chat_files,
)

REPO = Path(__file__).resolve().parents[2]
# Short prompts keep the Triton interpreter's time down; one crosses the 64-token chunk.
TEST_PROMPTS = {
    "prompts": [
        {"name": "tokens-1", "tokenIds": [60], "maxNewTokens": 5},
        {"name": "hello", "text": "Name the planets.", "maxNewTokens": 5},
        {
            "name": "list",
            "text": "Continue this list. Line 1: 1 squared is 1. Line 2: 2 squared is 4. Line 3: 3 squared is 9.",
            "maxNewTokens": 5,
        },
    ]
}


def variant(
    ckpt: Path, to: Path, *, jinja: str | None = None, bos: bool = False, eos: int | None = None
) -> Path:
    """A copy of `ckpt` changed where engines read it differently: a chat_template.jinja beside
    tokenizer_config.json's template, a tokenizer whose post-processor adds a BOS token
    (<|endoftext|>) when encoding, a config.json eos_token_id that generation_config.json lacks."""
    from tokenizers import Tokenizer, processors

    shutil.copytree(ckpt, to)
    if jinja is not None:
        (to / "chat_template.jinja").write_text(jinja)
    if bos:
        tok = Tokenizer.from_file(str(to / "tokenizer.json"))
        bos_id = tok.token_to_id("<|endoftext|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos_id)]
        )
        tok.save(str(to / "tokenizer.json"))
    if eos is not None:
        config = json.loads((to / "config.json").read_text())
        (to / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    return to


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without clef's knobs (a fault must be asked for)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_")}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def clef_runtime(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clef_runtime", *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        cwd=REPO,
        timeout=timeout,
    )


def session_goldens(base: Path) -> tuple[Path, Path]:
    """(checkpoint, goldens) under the session's temporary directory, made on first use."""
    ckpt, goldens = base / "chat-checkpoint", base / "goldens.json"
    if not goldens.is_file():
        write_chat_checkpoint(ckpt)
        prompts = base / "prompts.json"
        prompts.write_text(json.dumps(TEST_PROMPTS))
        proc = clef_runtime(
            "goldens", "--checkpoint", str(ckpt), "--out", str(goldens), "--device", "cpu",
            "--dtype", "f32", "--no-builtin", "--prompts", str(prompts),
        )  # fmt: skip
        assert proc.returncode == 0, f"goldens failed: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return ckpt, goldens


@contextmanager
def served(
    ckpt: Path, tmp: Path, *args: str, ops: str = "reference", fault: str | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`clef-runtime serve` on 127.0.0.1, a free port, in a subprocess; yields (base URL, process)
    once it listens, and stops it with SIGTERM afterwards."""
    ready = tmp / f"ready-{os.getpid()}-{time.monotonic_ns()}"
    log = (tmp / f"{ready.name}.log").open("w")
    env = clean_env(**({"CLEF_RUNTIME_FAULT": fault} if fault else {}))
    cmd = [sys.executable, "-m", "clef_runtime", "serve", "--checkpoint", str(ckpt), "--device", "cpu",
           "--dtype", "f32", "--ops", ops, "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 300  # a loaded CI host imports torch slowly
        while not (ready.is_file() and ready.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"serve did not start: {Path(log.name).read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{int(ready.read_text())}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def endpoint_check(
    goldens: Path, url: str, dialect: str, tmp: Path, *args: str
) -> tuple[int, dict, dict, str]:
    """Run `clef-runtime endpoint-check`; (exit code, full report, compact report, stderr)."""
    log = tmp / f"termination-{time.monotonic_ns()}"
    proc = clef_runtime(
        "endpoint-check", "--goldens", str(goldens), "--url", url, "--dialect", dialect,
        "--termination-log", str(log), "--timeout", "300", *args,
    )  # fmt: skip
    full = json.loads(proc.stdout)
    compact = json.loads(log.read_text())
    return proc.returncode, full, compact, proc.stderr
