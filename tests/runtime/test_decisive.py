"""The decisive verification checkpoint (`clef_devcluster.decisive`): its training covers the
built-in prompt set, its image-and-text copy (for mistral.rs) answers as the text model, and, where
it has been trained on this machine (`make decisive`, a few minutes), its goldens have the margins
docs/verification.md publishes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clef_devcluster import decisive
from clef_devcluster.checkpoints import write_chat_checkpoint, write_chat_files, write_image_text_layout
from clef_runtime.chat import GOLDENS, ChatTokenizer
from clef_runtime.goldens.prompts import builtin_prompts

REPO = Path(__file__).resolve().parents[2]
# What docs/verification.md publishes ("The decisive checkpoint"), with a little room: at least
# this share of the built-in set's golden positions have a margin of 1 nat or more, and none is
# below the near-tie margin of the comparison rule.
MIN_SHARE_1NAT = 0.95
MIN_MARGIN = 0.5


def test_the_training_covers_every_builtin_prompt(tmp_path: Path) -> None:
    """Every built-in prompt but the 8197-token one is one the trainer teaches an answer to: the
    numbered list from wherever it stops (with the filler words that pad it), the two questions,
    and a bare "The".  (The long prompt's 348 lines are past the training's LIST_MAX.)"""
    write_chat_files(tmp_path)
    tok = ChatTokenizer.from_dir(tmp_path, rendering=GOLDENS)
    specs = builtin_prompts(tok, long=False)
    untrained = [s.name for s in specs if s.kind == "chat" and not decisive.trained_on(s.text)]
    assert not untrained, f"built-in prompts the decisive checkpoint is not trained on: {untrained}"
    tokens = [s for s in specs if s.kind == "tokens"]
    raw = tok.encode(decisive.RAW_TEXT)
    assert tokens and all(list(s.prompt_ids) == raw[: len(s.prompt_ids)] for s in tokens), (
        "the built-in token-id prompt is not the start of the raw text the checkpoint is trained on"
    )


def test_a_list_prompt_longer_than_the_training_is_not_covered() -> None:
    assert decisive.trained_on(decisive._list_prompt(decisive.LIST_MAX - decisive.REPLY_LINES, 0))
    assert not decisive.trained_on(decisive._list_prompt(decisive.LIST_MAX, 0))
    assert not decisive.trained_on("Name the moons.")


def test_image_text_layout_gives_the_text_models_logits(tmp_path: Path) -> None:
    """mistral.rs loads Qwen3.5 only as Qwen3_5ForConditionalGeneration: the copy with a random
    one-layer vision tower and mrope must give the text model's logits (upstream transformers)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    text = write_chat_checkpoint(tmp_path / "text")
    both = write_image_text_layout(text, tmp_path / "image-text")
    raw = json.loads((both / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert raw["text_config"]["rope_parameters"]["mrope_section"] == [2, 1, 1]
    ids = torch.tensor([[5, 60, 61, 62, 100, 7, 8, 9, 200, 201]])
    with torch.no_grad():
        a = Qwen3_5ForCausalLM.from_pretrained(text, dtype=torch.float32).eval()(input_ids=ids).logits
        b = (
            Qwen3_5ForConditionalGeneration.from_pretrained(both, dtype=torch.float32)
            .eval()(input_ids=ids)
            .logits
        )
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_decisive_goldens_have_decisive_margins(dtype: str, tmp_path: Path) -> None:
    """Goldens of the trained checkpoint over the built-in set (without the 8197-token prompt):
    at least MIN_SHARE_1NAT of the positions at a margin of ≥ 1 nat, none under MIN_MARGIN."""
    where = decisive.cache_dir()
    if not (where / "TRAINED.json").is_file():
        pytest.skip(
            f"the decisive checkpoint is not trained here ({where}): `make decisive` trains it (a few minutes of CPU)"
        )
    out = tmp_path / "goldens.json"
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "goldens", "--checkpoint", str(where / dtype), "--out", str(out),
         "--device", "cpu", "--dtype", dtype, "--ops", "reference", "--no-long"],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"goldens failed: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    per = decisive.margins(out)
    values = [m for v in per.values() for m in v]
    share = sum(m >= 1.0 for m in values) / len(values)
    low = {name: [round(m, 3) for m in v if m < MIN_MARGIN] for name, v in per.items()}
    assert share >= MIN_SHARE_1NAT, (
        f"{share:.3f} of {len(values)} positions ≥ 1 nat: {decisive.distribution(values)}"
    )
    assert not any(low.values()), f"positions under {MIN_MARGIN} nats: {low}"
