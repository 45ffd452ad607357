"""The verification checkpoint with decisive margins: a small Qwen3.5-architecture model trained
here, on the CPU, in minutes, so that its greedy choices are not near-ties.

Goldens taken from a random model measure noise: most of its top-1/top-2 margins are a fraction of
a nat, and a correct bf16 engine legitimately flips some of them (real vLLM did: 95/104 tokens,
every divergence at a margin ≤ 0.125 nats).  A trained checkpoint has margins of nats at most
positions, as real checkpoints do; this one is trained until it does on the prompts it is checked
with (docs/verification.md, "The decisive checkpoint", has the measured distribution).

* Shapes every engine's kernels accept: GDN and attention head dim 128 (vLLM's CPU gated-delta-net
  path takes 64 or 128 only), 3 GDN layers and 1 attention layer (Qwen3.5's pattern), grouped
  heads on both kinds, partial rotary, an untied head.  Written in bf16 and in f16.
* Trained with upstream ``transformers`` (``Qwen3_5ForCausalLM``, its PyTorch gated-delta-rule)
  from `clef_runtime.model.checkpoint`'s deterministic initialisation; one thread, deterministic
  algorithms, fixed seeds and a fixed data order (bit-identical weights across CPU kinds are not
  promised, nor checked: the tests check the margins, not the bits).
* What it learns, on the chat files of `clef_devcluster.checkpoints` (tokenizer, template with the
  thinking switch, stop token): to continue the built-in prompt set's numbered list ("Line 17: 17
  squared is 289.") from wherever the user's list stops, to answer the built-in questions (and
  the tests' short planets prompt) with fixed answers, to continue a bare "The" with a fixed
  sentence, and to echo back any other user text.  The list and the echo need the context (the
  last line's number, the user's words), read through the GDN and attention layers, so a broken
  GDN path changes the greedy ids.
* Cached under ``~/.cache/clef/decisive-<key>/{bf16,f16}`` (``-s<steps>`` appended for a
  non-default step count) where the key covers the training code and data, the chat files' code
  and the torch/transformers versions (`cache_key`); weights are never committed.

``python -m clef_devcluster.decisive [--steps N]`` builds (or finds) it and prints the directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

STEPS = 1200
SEED = 0
DTYPES = ("bf16", "f16")
LIST_MAX = 56  # list lines the training covers (the built-in chat-1001 prompt has 46)
# The built-in prompts pad a list to their length with " yes" words: fewer than a line's worth (a
# line is 23 tokens of this tokenizer); chat-1001 has 16 of them after 46 lines.
FILLER_MAX = 24
REPLY_LINES = 4  # list lines in a reply (about 92 tokens): more than the 64 new tokens asked
INSTRUCTION = "Continue this list in exactly the same style for as long as you can."

PLANETS_Q = "Name the planets of the solar system in order, one per line, with one fact each."
PLANETS_A = (
    "Mercury: the closest to the Sun.\nVenus: the hottest.\nEarth: our home.\nMars: the red one.\n"
    "Jupiter: the largest.\nSaturn: the rings.\nUranus: on its side.\nNeptune: the windiest."
)
CODE_Q = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test."
CODE_A = (
    'def fib(n):\n    """The n-th Fibonacci number."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n'
    "\n\ndef test_fib():\n    assert fib(10) == 55\n"
)
SHORT_Q = {"Name the planets.": PLANETS_A}
RAW_TEXT = "The river runs north past the mill and the old stone bridge. "
WORDS = [
    "the",
    "river",
    "runs",
    "north",
    "past",
    "mill",
    "and",
    "old",
    "stone",
    "bridge",
    "name",
    "planets",
    "of",
    "solar",
    "system",
    "in",
    "order",
    "line",
    "squared",
    "is",
    "continue",
    "this",
    "list",
    "exactly",
    "same",
    "style",
    "for",
    "as",
    "long",
    "you",
    "can",
    "yes",
    "def",
    "return",
    "fib",
    "test",
    "number",
    "with",
    "a",
    "docstring",
    "write",
    "python",
    "function",
    "that",
    "returns",
    "one",
    "per",
    "fact",
    "each",
]


def config(vocab: int) -> Any:
    from clef_runtime.model import preset

    return preset("tiny").replace(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=384,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        max_position_embeddings=16384,
    )


def cache_key() -> str:
    """A digest of everything the weights depend on: the training code and data, the chat files'
    code, the constants and the torch/transformers versions (not the rest of this file)."""
    import inspect

    import torch
    import transformers

    from clef_devcluster import checkpoints
    from clef_runtime.model import checkpoint as init

    parts = [
        inspect.getsource(f)
        for f in (config, list_line, _list_prompt, _chat, examples, _train, checkpoints.write_chat_files,
                  checkpoints._train_tokenizer, init.random_weights, init._init, init.write_random_checkpoint)
    ]  # fmt: skip
    parts += [
        checkpoints.TEMPLATE,
        repr(checkpoints.SPECIALS),
        repr(checkpoints._CORPUS),
        str(checkpoints.VOCAB),
    ]
    parts += [repr((SEED, LIST_MAX, FILLER_MAX, REPLY_LINES, INSTRUCTION, PLANETS_Q, PLANETS_A, CODE_Q, CODE_A, SHORT_Q,
                    RAW_TEXT, WORDS))]  # fmt: skip
    parts += [f"torch {torch.__version__} transformers {transformers.__version__}"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    root = Path(os.environ.get("CLEF_CACHE", Path.home() / ".cache" / "clef"))
    return root / f"decisive-{cache_key()}"


def list_line(i: int) -> str:
    return f"Line {i}: {i} squared is {i * i}."


def _list_prompt(lines: int, filler: int) -> str:
    body = "\n".join(list_line(i) for i in range(1, lines + 1))
    return INSTRUCTION + "\n" + body + " yes" * filler


def trained_on(text: str) -> bool:
    """Whether a user turn is one the training teaches an answer to (other text is echoed): a
    list prompt within the trained lengths, or one of the questions."""
    if text in (PLANETS_Q, CODE_Q, *SHORT_Q):
        return True
    if not text.startswith(INSTRUCTION + "\n"):
        return False
    body = text[len(INSTRUCTION) + 1 :]
    stripped = body.removesuffix(" yes" * (filler := body.count(" yes")))
    lines = stripped.split("\n") if stripped else []
    if lines != [list_line(i) for i in range(1, len(lines) + 1)]:
        return False
    return len(lines) <= LIST_MAX - REPLY_LINES and filler <= FILLER_MAX


def _chat(tok: Any, user: str, reply: str) -> list[int]:
    rendered = tok.render([{"role": "user", "content": user}], enable_thinking=False)
    return tok.encode(rendered) + tok.encode(reply + "<|im_end|>\n")


def examples(tok: Any, rng: random.Random) -> list[int]:
    """One training sequence (ids), drawn from the task mixture."""
    kind = rng.random()
    if kind < 0.60:
        # The built-in chat-63/64/65 prompts are the instruction and filler words (a list line is
        # 23 tokens of this tokenizer); chat-1001 is 46 lines.  Short lists are cheap: most are.
        lines = rng.randint(1, LIST_MAX - REPLY_LINES) if rng.random() < 0.35 else rng.randint(0, 8)
        filler = rng.randint(0, FILLER_MAX) if rng.random() < 0.7 else 0
        start = lines + 1
        reply = "\n".join(list_line(i) for i in range(start, start + REPLY_LINES))
        return _chat(tok, _list_prompt(lines, filler), reply)
    if kind < 0.75:
        q, a = rng.choice(((PLANETS_Q, PLANETS_A), (CODE_Q, CODE_A), *SHORT_Q.items()))
        return _chat(tok, q, a)
    if kind < 0.85:
        return tok.encode(RAW_TEXT * 4)
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 12))]
    text = " ".join(words)
    text = text[0].upper() + text[1:] + rng.choice((".", "?", ""))
    return _chat(tok, text, text)


def _train(directory: Path, steps: int, log: Any) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5ForCausalLM

    from clef_devcluster.checkpoints import write_chat_files
    from clef_runtime.chat import GOLDENS, ChatTokenizer
    from clef_runtime.model.checkpoint import write_random_checkpoint

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    init = directory / "init"
    vocab = write_chat_files(init)
    cfg = config(vocab)
    write_random_checkpoint(init, cfg, seed=SEED, dtype=torch.float32)
    tok = ChatTokenizer.from_dir(init, rendering=GOLDENS)
    model = Qwen3_5ForCausalLM.from_pretrained(init, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(SEED)
    warmup = 50
    started = time.monotonic()
    tokens = 0
    losses: list[float] = []
    for step in range(steps):
        lr = 3e-3 * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = torch.tensor([examples(tok, rng)])
        tokens += ids.numel()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        if step % 100 == 0 or step == steps - 1:
            recent = sum(losses[-100:]) / len(losses[-100:])
            print(
                f"step {step}/{steps} loss {recent:.4f} lr {lr:.2e} {time.monotonic() - started:.0f}s",
                file=log,
                flush=True,
            )
    seconds = time.monotonic() - started
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        out_dir = directory / name
        shutil.copytree(init, out_dir, ignore=shutil.ignore_patterns("model.safetensors"))
        raw = json.loads((out_dir / "config.json").read_text())
        raw["dtype"] = {"bf16": "bfloat16", "f16": "float16"}[name]
        (out_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        save_file({k: v.to(dtype) for k, v in state.items()}, str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
    shutil.rmtree(init)
    return {"steps": steps, "seconds": round(seconds, 1), "tokens": tokens,
            "finalLoss": round(sum(losses[-100:]) / len(losses[-100:]), 5)}  # fmt: skip


def build(steps: int = STEPS, log: Any = sys.stderr) -> Path:
    """The cached checkpoint directory (``bf16/`` and ``f16/`` inside), trained on first use."""
    out = cache_dir() if steps == STEPS else cache_dir().with_name(f"{cache_dir().name}-s{steps}")
    if (out / "TRAINED.json").is_file():
        return out
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = _train(tmp, steps, log)
    (tmp / "TRAINED.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def margins(goldens: str | Path) -> dict[str, list[float]]:
    """Every golden position's top-1/top-2 margin in nats (logprob of the greedy token minus the
    runner-up's), by prompt."""
    from clef_runtime.goldens.schema import read_goldens

    return {p.name: [t[0] - t[1] for t in p.top_logprobs] for p in read_goldens(goldens).prompts}


def distribution(values: list[float]) -> dict[str, Any]:
    """The summary docs/verification.md publishes: count, quantiles, shares below 0.5/1/2 nats."""
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * len(v)))], 3)

    return {
        "positions": len(v),
        "min": round(v[0], 3),
        "p01": q(0.01),
        "p05": q(0.05),
        "p10": q(0.10),
        "median": q(0.5),
        "below0.5": sum(x < 0.5 for x in v),
        "below1": sum(x < 1.0 for x in v),
        "below2": sum(x < 2.0 for x in v),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m clef_devcluster.decisive", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--print-dir", action="store_true", help="print the cache directory; exit 1 if not built")
    ap.add_argument("--margins", metavar="GOLDENS", help="print a goldens file's margin distribution (JSON)")
    args = ap.parse_args(argv)
    if args.margins:
        per = margins(args.margins)
        report = {name: distribution(v) for name, v in per.items()}
        report["all"] = distribution([x for v in per.values() for x in v])
        print(json.dumps(report, indent=2))
        return 0
    if args.print_dir:
        print(cache_dir())
        return 0 if (cache_dir() / "TRAINED.json").is_file() else 1
    print(build(args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
