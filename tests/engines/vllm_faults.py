"""The test side of the faults injected into real vLLM ((b) and (c) of the real-engine tier):
the plugin distribution vLLM loads `clef_vllm_faults` from, and where (c) acts, chosen from the
goldens.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
MODULE = "clef_vllm_faults"
# (c) acts only where the golden's choice is decisive (a flip there is a fault, never rounding)
# and where its runner-up is clear of the third choice (so the engine's own runner-up is the
# golden's, and the test can name the token it must see).
DECISIVE = 1.0  # nats, golden top-1 over top-2
CLEAR_RUNNER_UP = 0.5  # nats, golden top-2 over top-3


def write_plugin(where: Path) -> Path:
    """`where` holding a copy of `clef_vllm_faults.py` and a `.dist-info` naming its two entry
    points, so that importlib.metadata in a Python with `where` on PYTHONPATH finds them.  Nothing
    is installed anywhere."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / f"{MODULE}.py", where / f"{MODULE}.py")
    info = where / f"{MODULE}-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{MODULE} = {MODULE}:register\n\n"
        f"[vllm.logits_processors]\n{MODULE} = {MODULE}:RunnerUpAt\n"
    )
    return where


@dataclass(frozen=True)
class Target:
    """Where (c) acts: absolute position `at` of the last fed token, which is generated position
    `position` of prompt `prompt` and of no other prompt."""

    prompt: str
    position: int
    at: int
    expected_id: int
    runner_up_id: int
    margin: float


def _span(prompt: dict[str, Any]) -> range:
    """The absolute positions of the last fed token over the steps that generate `prompt`'s ids."""
    first = len(prompt["promptIds"]) - 1
    return range(first, first + len(prompt["ids"]))


def runner_up_targets(goldens: dict[str, Any]) -> list[Target]:
    """Every place (c) may act: a generated position whose absolute position falls inside no other
    prompt's span (only the intended prompt is hit), with a decisive golden margin and a clear
    runner-up that is not a stop token, in goldens order."""
    prompts = goldens["prompts"]
    stops = set(goldens["stopIds"])
    out = []
    for p in prompts:
        others = [_span(o) for o in prompts if o is not p]
        for position, at in enumerate(_span(p)):
            lps, ids = p["topLogprobs"][position], p["topIds"][position]
            if any(at in span for span in others) or ids[1] in stops:
                continue
            if lps[0] - lps[1] >= DECISIVE and lps[1] - lps[2] >= CLEAR_RUNNER_UP:
                out.append(Target(p["name"], position, at, ids[0], ids[1], lps[0] - lps[1]))
    return out


def runner_up_target(goldens: dict[str, Any]) -> Target:
    """The place (c) acts: among `runner_up_targets`, the one nearest the middle of the longest
    answer that has any (tokens before it must match, tokens after it are not judged)."""
    targets = runner_up_targets(goldens)
    if not targets:
        raise AssertionError("no generated position of these goldens is decisive and hit by one prompt only")
    lengths = {p["name"]: len(p["ids"]) for p in goldens["prompts"]}
    name = max({t.prompt for t in targets}, key=lambda n: (lengths[n], n))
    middle = lengths[name] // 2
    return min((t for t in targets if t.prompt == name), key=lambda t: (abs(t.position - middle), t.position))
