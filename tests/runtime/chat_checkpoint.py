"""A small checkpoint that a serving engine could load: tiny hybrid weights (3 GDN + 1 attention
layer), a byte-level BPE tokenizer trained here on a fixed text (no downloads), a Qwen-style chat
template with the thinking switch, and a generation config naming the stop token.

Also the goldens the endpoint tests share, made once per test session by the real command
(`clef-runtime goldens`, Triton op set: its kernels suite runs first).
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

import torch

from clef_runtime.model import preset
from clef_runtime.model.checkpoint import write_random_checkpoint

REPO = Path(__file__).resolve().parents[2]
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
VOCAB = 320

# Qwen's shape: one turn per message, the assistant's turn opened by add_generation_prompt, and
# with thinking off an empty think block, which is what engines send when asked `thinking: false`.
TEMPLATE = """{%- for message in messages %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}
<think>

</think>

{% endif %}
{%- endif %}
"""

# The same conversation rendered without the think block: what a server with another template sends.
OTHER_TEMPLATE = TEMPLATE.replace("<think>\n\n</think>\n\n", "")

_CORPUS = [
    "Line {i}: {i} squared is {sq}. The river runs north past the mill and the old stone bridge.",
    "Name the planets of the solar system in order: Mercury, Venus, Earth, Mars, Jupiter, Saturn.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Continue this list in exactly the same style for as long as you can. yes yes yes",
]


def _train_tokenizer(path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = [line.format(i=i, sq=i * i) for i in range(1, 40) for line in _CORPUS]
    tok.train_from_iterator(text, trainer)
    tok.save(str(path))


def _sharpen(path: Path) -> None:
    """Make the random model decisive and its GDN layers matter: the output head x8 (top-1 margins
    of about a nat instead of a fraction: a near-tie is then a rarity, as in a trained model) and
    each GDN layer's output x4 (so every catalogue fault changes the greedy ids within 4 tokens)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors["lm_head.weight"] *= 8
    for name in tensors:
        if name.endswith("linear_attn.out_proj.weight"):
            tensors[name] *= 4
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_chat_files(directory: Path, vocab: int = VOCAB) -> int:
    """Everything but the weights: tokenizer.json, tokenizer_config.json (chat template, eos),
    generation_config.json.  Returns the tokenizer's vocabulary size."""
    from tokenizers import Tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(directory / "tokenizer.json", vocab)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [tok.token_to_id("<|im_end|>")]})
    )
    return int(tok.get_vocab_size(with_added_tokens=True))


def write_chat_checkpoint(directory: Path, *, seed: int = 0) -> Path:
    """The checkpoint directory: the chat files and tiny hybrid weights (float32) over their vocabulary."""
    vocab = write_chat_files(directory)
    config = preset("tiny").replace(vocab_size=vocab)
    write_random_checkpoint(directory, config, seed=seed, dtype=torch.float32)
    _sharpen(directory / "model.safetensors")
    return directory


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
